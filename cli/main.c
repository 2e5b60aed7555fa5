// `train`: the onepass command line.
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const char USAGE[] =
    "usage: train [run] --config FILE [--set key=value]... [--gpus N]   train a model\n"
    "       train pack --config FILE [--set k=v]... --out rows.jsonl [--skip-bad]\n"
    "       train parity --config FILE [--set k=v]... --json out.json\n"
    "       train show --config FILE [--set k=v]... --conversation N --out DIR [--rows]\n"
    "       train gen-data --out-dir DIR [--seed N] [--train N] [--eval N] [--shared N]\n"
    "       train tokenizer --corpus-from FILE.jsonl --out PREFIX [--vocab-size N]\n"
    "       train export --from CHECKPOINT --out DIR [--dtype bf16|f16|f32]\n"
    "       train generate --config FILE [--set k=v]... --prompts F.jsonl --out G.jsonl\n"
    "       train eval --config FILE [--set k=v]... [--json out.json]\n"
    "       train config [--markdown] | train config --config FILE [--set k=v]...\n";

static void usage(FILE *f) { fputs(USAGE, f); }

// `train SUB --help` (or -h anywhere among its arguments): SUB's line of the usage.
// Returns whether SUB has one.
static bool sub_usage(const char *sub) {
    char want[64];
    snprintf(want, sizeof want, strcmp(sub, "run") == 0 ? "train [run] " : "train %s ", sub);
    for (const char *line = USAGE; *line;) {
        const char *end = strchr(line, '\n');
        const char *at = strstr(line, want);
        if (at && at < end) {
            printf("usage: %.*s\n", (int)(end - at), at);
            return true;
        }
        line = end + 1;
    }
    return false;
}

static bool asks_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return true;
    return false;
}

int main(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    const char *sub = argc >= 2 && argv[1][0] != '-' ? argv[1] : "run";
    int skip = argc >= 2 && argv[1][0] != '-' ? 2 : 1;
    int sub_argc = argc - skip;
    char **sub_argv = argv + skip;
    if (asks_help(sub_argc, sub_argv) && sub_usage(sub)) return 0;
    if (strcmp(sub, "run") == 0) return cmd_train(sub_argc, sub_argv);
    if (strcmp(sub, "pack") == 0) return cmd_pack(sub_argc, sub_argv);
    if (strcmp(sub, "parity") == 0) return cmd_parity(sub_argc, sub_argv);
    if (strcmp(sub, "show") == 0) return cmd_show(sub_argc, sub_argv);
    if (strcmp(sub, "gen-data") == 0) return cmd_gen_data(sub_argc, sub_argv);
    if (strcmp(sub, "tokenizer") == 0) return cmd_tokenizer(sub_argc, sub_argv);
    if (strcmp(sub, "export") == 0) return cmd_export(sub_argc, sub_argv);
    if (strcmp(sub, "generate") == 0) return cmd_generate(sub_argc, sub_argv);
    if (strcmp(sub, "eval") == 0) return cmd_eval(sub_argc, sub_argv);
    if (strcmp(sub, "config") == 0) return cmd_config(sub_argc, sub_argv);
    fprintf(stderr, "train: unknown command '%s'\n", sub);
    usage(stderr);
    return 2;
}
