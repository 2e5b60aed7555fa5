// `train tokenizer --corpus-from FILE.jsonl --out PREFIX [--vocab-size N]`:
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
#include "model/hf_export.h"
#include "trainer/tokenizer_corpus.h"

static void usage_exit(void) {
    fatal("usage: train tokenizer --corpus-from FILE.jsonl --out PREFIX [--vocab-size N]");
}

int cmd_tokenizer(int argc, char **argv) {
    const char *corpus_from = NULL, *prefix = NULL;
    int vocab_size = 512;
    for (int i = 0; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
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

    char err[1024], *folder = strdup(prefix);
    // The folder of PREFIX is created when missing, as gen-data's --out-dir is.
    if (strchr(prefix, '/') && make_dirs(dirname(folder), err, sizeof err) != 0)
        fatal("train tokenizer: --out %s: %s", prefix, err);
    free(folder);
    Dataset d;
    dataset_load(corpus_from, &(LoadOptions){0}, &d);
    if (tokenizer_train_on(&d, prefix, vocab_size, err, sizeof err) != 0) fatal("%s", err);
    printf("tokenizer: %d samples from %s -> %s.model (vocab %d)\n", d.n_samples, corpus_from,
           prefix, vocab_size);
    dataset_free(&d);
    return 0;
}
