// `train gen-data --out-dir DIR [--seed N] [--train N] [--eval N] [--shared N]`: writes
// the synthetic data sets (data/synthetic.h) the repository ships. With
// `--profile chat|agentic [--tokenizer PATH] [--max-tokens N]`: train.jsonl and
// eval.jsonl of realistic shapes instead (data/synthetic_profile.h), lengths in tokens of
// PATH, each conversation fitting a row of N. With `--profile demo`: train.jsonl and
// eval.jsonl of the CPU demonstration task (data/synthetic_demo.h).
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "common/check.h"
#include "common/output_file.h"
#include "data/synthetic.h"
#include "data/synthetic_demo.h"
#include "data/synthetic_profile.h"
#include "data/tokenizer.h"

static long parse_count(const char *flag, const char *text) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < 0) fatal("%s: expected a non-negative integer, got '%s'", flag, text);
    return v;
}

static void write_split(const char *dir, const char *name, uint64_t seed, int n,
                        void (*writer)(FILE *, uint64_t, int)) {
    size_t len = strlen(dir) + strlen(name) + 2;
    char *path = xmalloc(len);
    snprintf(path, len, "%s/%s", dir, name);
    OutputFile out;
    char err[1024];
    if (output_open(&out, path, err, sizeof err) != 0) fatal("%s", err);
    writer(out.f, seed, n);
    if (output_commit(&out, err, sizeof err) != 0) fatal("%s", err);
    printf("gen-data: %d samples -> %s\n", n, path);
    free(path);
}

// The profile's splits: train.jsonl and eval.jsonl.
static void write_profile(const char *dir, const char *name, SynthProfile p, const Tokenizer *tok,
                          uint64_t seed, int n, long long max_tokens) {
    size_t len = strlen(dir) + strlen(name) + 2;
    char *path = xmalloc(len);
    snprintf(path, len, "%s/%s", dir, name);
    OutputFile out;
    char err[1024];
    if (output_open(&out, path, err, sizeof err) != 0) fatal("%s", err);
    synth_profile_write(out.f, p, tok, seed, n, max_tokens);
    if (output_commit(&out, err, sizeof err) != 0) fatal("%s", err);
    printf("gen-data: %d samples -> %s\n", n, path);
    free(path);
}

int cmd_gen_data(int argc, char **argv) {
    const char *out_dir = NULL, *profile = NULL, *tokenizer = "datasets/synthetic/tokenizer.model";
    long seed = 1234, n_train = 2000, n_eval = 200, n_shared = 200, max_tokens = 0;
    for (int i = 0; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!value)
            fatal("gen-data: %s needs a value (usage: train gen-data --out-dir DIR [--seed N] "
                  "[--train N] [--eval N] [--shared N] [--profile chat|agentic|demo] [--tokenizer PATH] [--max-tokens N])",
                  flag);
        i++;
        if (strcmp(flag, "--out-dir") == 0)
            out_dir = value;
        else if (strcmp(flag, "--seed") == 0)
            seed = parse_count(flag, value);
        else if (strcmp(flag, "--train") == 0)
            n_train = parse_count(flag, value);
        else if (strcmp(flag, "--eval") == 0)
            n_eval = parse_count(flag, value);
        else if (strcmp(flag, "--shared") == 0)
            n_shared = parse_count(flag, value);
        else if (strcmp(flag, "--profile") == 0)
            profile = value;
        else if (strcmp(flag, "--tokenizer") == 0)
            tokenizer = value;
        else if (strcmp(flag, "--max-tokens") == 0)
            max_tokens = parse_count(flag, value);
        else
            fatal("gen-data: unknown argument '%s'", flag);
    }
    if (!out_dir) fatal("gen-data: --out-dir DIR is required");
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST)
        fatal("%s: cannot create directory: %s", out_dir, strerror(errno));
    if (profile && strcmp(profile, "demo") == 0) {
        write_split(out_dir, "train.jsonl", synthetic_split_seed((uint64_t)seed, 0), (int)n_train,
                    synth_demo_write);
        write_split(out_dir, "eval.jsonl", synthetic_split_seed((uint64_t)seed, 1), (int)n_eval,
                    synth_demo_write);
        return 0;
    }
    if (profile) {
        SynthProfile p;
        if (synth_profile_parse(profile, &p) != 0)
            fatal("gen-data: --profile: expected chat, agentic or demo, got '%s'", profile);
        char err[1024];
        Tokenizer *tok = tokenizer_load(tokenizer, err, sizeof err);
        if (!tok) fatal("gen-data: --tokenizer: %s", err);
        write_profile(out_dir, "train.jsonl", p, tok, synthetic_split_seed((uint64_t)seed, 0),
                      (int)n_train, max_tokens);
        write_profile(out_dir, "eval.jsonl", p, tok, synthetic_split_seed((uint64_t)seed, 1),
                      (int)n_eval, max_tokens);
        tokenizer_free(tok);
        return 0;
    }
    write_split(out_dir, "train.jsonl", synthetic_split_seed((uint64_t)seed, 0), (int)n_train,
                synthetic_write_conversations);
    write_split(out_dir, "eval.jsonl", synthetic_split_seed((uint64_t)seed, 1), (int)n_eval,
                synthetic_write_conversations);
    write_split(out_dir, "shared_prefix.jsonl", synthetic_split_seed((uint64_t)seed, 2),
                (int)n_shared, synthetic_write_shared_prefix);
    return 0;
}
