// `train`: the onepass command line.
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static void usage(FILE *f) {
    fputs("usage: train [run] --config FILE [--set key=value]...      train a model\n"
          "       train pack --config FILE [--set k=v]... --out rows.jsonl [--skip-bad]\n"
          "       train parity --config FILE [--set k=v]... --json out.json\n"
          "       train show --config FILE [--set k=v]... --conversation N --out DIR [--rows]\n"
          "       train gen-data --out-dir DIR [--seed N] [--train N] [--eval N] [--shared N]\n"
          "       train tokenizer --corpus-from FILE.jsonl --out PREFIX [--vocab-size N]\n"
          "       train export --from CHECKPOINT --out DIR [--dtype bf16|f16|f32]\n",
          f);
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
    if (strcmp(sub, "run") == 0) return cmd_train(sub_argc, sub_argv);
    if (strcmp(sub, "pack") == 0) return cmd_pack(sub_argc, sub_argv);
    if (strcmp(sub, "parity") == 0) return cmd_parity(sub_argc, sub_argv);
    if (strcmp(sub, "show") == 0) return cmd_show(sub_argc, sub_argv);
    if (strcmp(sub, "gen-data") == 0) return cmd_gen_data(sub_argc, sub_argv);
    if (strcmp(sub, "tokenizer") == 0) return cmd_tokenizer(sub_argc, sub_argv);
    if (strcmp(sub, "export") == 0) return cmd_export(sub_argc, sub_argv);
    fprintf(stderr, "train: unknown command '%s'\n", sub);
    usage(stderr);
    return 2;
}
