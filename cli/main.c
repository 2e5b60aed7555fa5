// `train`: the onepass command line.
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const char USAGE[] =
    "usage: train [run] --config FILE [--set key=value]... [--gpus N]   train a model\n"
    "       train pack --config FILE [--set k=v]... --out rows.jsonl [--skip-bad] [--show LINE]\n"
    "       train parity --config FILE [--set k=v]... --json out.json\n"
    "       train show --config FILE [--set k=v]... --conversation N --out DIR [--rows]\n"
    "       train gen-data --out-dir DIR [--seed N] [--train N] [--eval N] [--shared N]\n"
    "       train tokenizer --corpus-from FILE.jsonl --out PREFIX [--vocab-size N]\n"
    "       train export --from CHECKPOINT --out DIR [--dtype bf16|f16|f32] [--merge [--base DIR]]\n"
    "       train generate --config FILE [--set k=v]... --prompts F.jsonl --out G.jsonl\n"
    "       train eval --config FILE [--set k=v]... [--json out.json]\n"
    "       train config [--markdown] | train config --config FILE [--set k=v]...\n"
    "       train memory --config FILE [--set k=v]... [--gpu-gib N] [--host-gib N]\n"
    "       train plot RUN_DIR [--out FILE.png]\n";

static const char MORE[] =
    "\n`train COMMAND --help` describes a command. The config is JSON (configs/*.json): every\n"
    "key, its type, default, range and meaning is listed by `train config` and in\n"
    "docs/CONFIG.md; --set key=value overrides one. Paths resolve from the working directory.\n"
    "Start from configs/strip_thinking.json (a small model on synthetic data) or\n"
    "configs/finetune.json with --set model.init_from=MODEL_FOLDER (README.md).\n";

// What each command does and its options, after its usage line (`train SUB --help`).
static const struct {
    const char *name, *text;
} HELP[] = {
    {"run", "Trains the model of the config on data.train_path and writes out_dir: run_config.json,\n"
            "metrics.jsonl and checkpoint-N/ folders (Hugging Face folders with optimizer state).\n"
            "  --config FILE   the JSON config (keys: `train config`, docs/CONFIG.md)\n"
            "  --set key=value override one key, e.g. --set train.lr=2e-5 (repeatable)\n"
            "  --gpus N        start N local ranks, data parallel\n"
            "Ctrl-C finishes the step, writes a checkpoint and exits; train.resume continues it.\n"},
    {"pack", "Lays out and packs data.train_path as training would, writes the rows as JSONL and\n"
             "prints the data set's statistics (tokens, packing, mask tiles).\n"
             "  --out rows.jsonl one JSON object per packed row (tokens, targets, pos, lo, hi, ...)\n"
             "  --skip-bad       skip and count malformed lines instead of refusing the file\n"
             "  --show LINE      print that line's documents as packed: text in segments, then\n"
             "                   each token's slot, position, role, id, piece and target\n"},
    {"parity", "Forward and backward of parity.conversations conversations under every layout,\n"
               "loss and gradients compared with N-pass training.\n"
               "  --json out.json  the comparison (required)\n"},
    {"show", "Draws the layouts of one conversation: tokens, positions, the mask, its tiles and\n"
             "the differences from npass, as PNG files.\n"
             "  --conversation N the conversation on line N of data.train_path\n"
             "  --out DIR        where the pictures go\n"
             "  --rows           the packed rows of that conversation and those after it\n"},
    {"gen-data", "Writes the synthetic data sets (chained arithmetic, 1 to 8 turns).\n"
                 "  --out-dir DIR   created when missing: train.jsonl, eval.jsonl, shared_prefix.jsonl\n"
                 "  --seed N        (1234)  --train N (2000)  --eval N (200)  --shared N (200)\n"
                 "  --profile P     chat or agentic (benchmark shapes), or demo (the CPU demonstration:\n"
                 "                  a code reversed in turn 1's thinking, asked for in turn 2)\n"},
    {"tokenizer", "Trains a SentencePiece model on the text of a JSONL data file, with the onepass\n"
                  "template's control tokens as their own ids.\n"
                  "  --corpus-from FILE.jsonl the conversations whose text is the corpus\n"
                  "  --out PREFIX             writes PREFIX.model and PREFIX.vocab\n"
                  "  --vocab-size N           pieces (512)\n"},
    {"export", "Writes a checkpoint as a Hugging Face folder without optimizer state.\n"
               "  --from CHECKPOINT a checkpoint-N folder (or any model folder)\n"
               "  --out DIR         the new folder\n"
               "  --dtype D         bf16, f16 or f32 (default: the checkpoint's)\n"
               "  A LoRA run's checkpoint (a PEFT adapter folder) exports as its adapter folder.\n"
               "  --merge           the adapters merged into their base model: a model folder\n"
               "  --base DIR        the base model folder (default: base_model_name_or_path)\n"},
    {"generate", "Continues each conversation of a JSONL file from its inference view with the\n"
                 "model of model.init_from (generate.* keys: temperature, top_p, max_new_tokens).\n"
                 "  --prompts F.jsonl conversations ending in a user message\n"
                 "  --out G.jsonl     one line per prompt: the generated text and token ids\n"},
    {"eval", "Generates every assistant turn of data.eval_path from the gold history with the\n"
             "model of model.init_from and checks its answer: accuracy per turn index, and the\n"
             "eval loss of the same conversations.\n"
             "  --json out.json  the report as JSON too\n"},
    {"plot", "Draws a run's curves from RUN_DIR/metrics.jsonl into one PNG: training and eval\n"
             "loss, learning rate, tokens/s, and the eval accuracy when the run generated.\n"
             "  --out FILE.png   where it goes (RUN_DIR/curves.png)\n"},
    {"memory", "Prints what a CUDA run of the config needs on the GPU and on the host in each memory\n"
               "mode (train.recompute, train.offload_activations, train.offload_optimizer), from the\n"
               "estimates the CUDA backend refuses runs by, and the first mode that fits. Any\n"
               "machine: no GPU is needed.\n"
               "  --gpu-gib N      the GPU's memory in GiB (default: the free memory of the GPU here;\n"
               "                   needed where none is visible; an 80 GB H100 has about 79)\n"
               "  --host-gib N     the host's memory in GiB (default: this machine's available)\n"},
    {"config", "Prints every config key with its type, default, range, resume rule and meaning;\n"
               "with --config/--set, the resolved config of that file instead.\n"
               "  --markdown       the key table as docs/CONFIG.md holds it\n"},
};

static void usage(FILE *f) {
    fputs(USAGE, f);
    fputs(MORE, f);
}

// `train SUB --help` (or -h anywhere among its arguments): SUB's line of the usage and
// what it does. Returns whether SUB has one.
static bool sub_usage(const char *sub) {
    char want[64];
    snprintf(want, sizeof want, strcmp(sub, "run") == 0 ? "train [run] " : "train %s ", sub);
    for (const char *line = USAGE; *line;) {
        const char *end = strchr(line, '\n');
        const char *at = strstr(line, want);
        if (at && at < end) {
            printf("usage: %.*s\n\n", (int)(end - at), at);
            for (size_t i = 0; i < sizeof HELP / sizeof HELP[0]; i++)
                if (strcmp(HELP[i].name, sub) == 0) fputs(HELP[i].text, stdout);
            printf("\nConfig keys: `train config`, docs/CONFIG.md.\n");
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
    if (argc == 1 || (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0))) {
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
    if (strcmp(sub, "plot") == 0) return cmd_plot(sub_argc, sub_argv);
    if (strcmp(sub, "memory") == 0) return cmd_memory(sub_argc, sub_argv);
    fprintf(stderr, "train: unknown command '%s'\n", sub);
    usage(stderr);
    return 2;
}
