// `train tokenizer --corpus-from FILE.jsonl --out PREFIX [--vocab-size N] [--config F]
// [--set K=V]`:
// trains PREFIX.model on the onepass-template-rendered text of a conversation dataset, with
// the onepass template's control tokens.
#define _POSIX_C_SOURCE 200809L  // strdup
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/check.h"
#include "data/conversation.h"
#include "trainer/config.h"
#include "trainer/data_options.h"
#include "model/hf_export.h"
#include "trainer/tokenizer_corpus.h"

static void usage_exit(void) {
    fatal("usage: train tokenizer --corpus-from FILE.jsonl --out PREFIX [--vocab-size N] "
          "[--config FILE] [--set KEY=VALUE ...] (the data.* keys decide how the corpus is read)");
}

int cmd_tokenizer(int argc, char **argv) {
    const char *corpus_from = NULL, *prefix = NULL, *config_path = NULL;
    char **overrides = NULL;
    int n_overrides = 0;
    const int rest = config_take_args(argc, argv, &config_path, &overrides, &n_overrides);
    int vocab_size = 512;
    for (int i = 0; i < rest; i++) {
        const char *value = i + 1 < rest ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--corpus-from") == 0 && value)
            corpus_from = argv[++i];
        else if (strcmp(argv[i], "--out") == 0 && value)
            prefix = argv[++i];
        else if (strcmp(argv[i], "--vocab-size") == 0 && value) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v <= 0 || v > (1 << 24)) fatal("--vocab-size: bad value '%s'", argv[i]);
            vocab_size = (int)v;
        } else {
            fprintf(stderr, "train tokenizer: unexpected argument '%s'\n", argv[i]);
            usage_exit();
        }
    }
    if (!corpus_from || !prefix) usage_exit();
    RunConfig *c = config_load(config_path, n_overrides, overrides);
    free(overrides);
    const DataOptions data_opt = data_options_from_config(c);
    const LoadOptions load = data_load_options(&data_opt);  // the run's reading options

    char err[1024], *folder = strdup(prefix);
    // The folder of PREFIX is created when missing, as gen-data's --out-dir is.
    if (strchr(prefix, '/') && make_dirs(dirname(folder), err, sizeof err) != 0)
        fatal("train tokenizer: --out %s: %s", prefix, err);
    free(folder);
    Dataset d;
    dataset_load(corpus_from, &load, &d);
    if (tokenizer_train_on(&d, prefix, vocab_size, err, sizeof err) != 0) fatal("%s", err);
    printf("tokenizer: %d samples from %s -> %s.model (vocab %d)\n", d.n_samples, corpus_from,
           prefix, vocab_size);
    dataset_free(&d);
    config_free(c);
    return 0;
}
