// SentencePiece training on a conversation dataset (trainer/tokenizer_corpus.h).
#include "trainer/tokenizer_corpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/check.h"
#include "common/output_file.h"
#include "data/template.h"

// Writes head + text + tail as corpus sentences: SentencePiece reads one sentence
// per line, so a multi-line text becomes several sentences (head on the first,
// tail on the last).
static void write_sentences(FILE *f, const char *head, const char *text, const char *tail) {
    fprintf(f, "%s%s%s\n", head, text, tail);
}

static void write_message(FILE *f, const Message *m) {
    switch (m->role) {
    case MSG_SYSTEM: write_sentences(f, TEMPLATE_SYSTEM_HEADER, m->content, ""); break;
    case MSG_USER:
    case MSG_TOOL:
        write_sentences(f, TEMPLATE_USER_HEADER, m->content, TEMPLATE_ASSISTANT_HEADER);
        break;
    case MSG_ASSISTANT:
        if (m->reasoning)
            write_sentences(f, TEMPLATE_THINK_OPEN, m->reasoning, TEMPLATE_THINK_CLOSE);
        write_sentences(f, "", m->content, TEMPLATE_END_OF_TURN);
        break;
    }
}

static void write_corpus(const Dataset *d, const char *corpus_path) {
    OutputFile out;
    char err[1024];
    if (output_open(&out, corpus_path, err, sizeof err) != 0) fatal("%s", err);
    FILE *f = out.f;
    for (int i = 0; i < d->n_samples; i++) {
        const Sample *s = &d->samples[i];
        for (int j = 0; j < s->n_messages; j++) write_message(f, &s->messages[j]);
        for (int j = 0; j < s->n_completions; j++) write_message(f, &s->completions[j]);
    }
    if (output_commit(&out, err, sizeof err) != 0) fatal("%s", err);
}

// SentencePiece writes PREFIX.model and PREFIX.vocab itself, in place: refuse the names
// that common/output_file.h would refuse (an input of the run, a directory) or could not
// write without replacing (a device or FIFO would be truncated or replaced).
static void check_sentencepiece_outputs(const char *prefix) {
    static const char *const suffixes[] = {".model", ".vocab"};
    for (int i = 0; i < 2; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s%s", prefix, suffixes[i]);
        const char *input = NULL;
        struct stat st;
        if (output_is_input(path, &input))
            fatal("%s: refusing to overwrite an input of this run (%s)", path, input);
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
            fatal("%s: not a regular file (the tokenizer's outputs must be)", path);
    }
}

int tokenizer_train_on(const Dataset *d, const char *prefix, int vocab_size, char *err,
                       size_t err_len) {
    check_sentencepiece_outputs(prefix);
    size_t corpus_len = strlen(prefix) + sizeof(".corpus.txt");
    char *corpus_path = xmalloc(corpus_len);
    snprintf(corpus_path, corpus_len, "%s.corpus.txt", prefix);
    write_corpus(d, corpus_path);
    int rc = tokenizer_train(corpus_path, prefix, vocab_size, &TEMPLATE_ONEPASS, err, err_len);
    remove(corpus_path);
    free(corpus_path);
    return rc;
}
