// Benchmark (not a test) of tokenization on one thread: every sample of a JSONL file
// through sample_tokenize (the template's segments, text fields encoded plain), as the
// data loader runs it. Throughput counts the bytes of the rendered text: each message's
// content and reasoning plus the template tokens around them. Best of 3 runs.
//   bench_tokenize TOKENIZER [FILE.jsonl]   (default datasets/synthetic/train.jsonl)
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "data/conversation.h"
#include "data/template.h"
#include "data/tokenize.h"

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t message_bytes(const Message *m) {
    size_t n = strlen(m->content ? m->content : "") + strlen(TEMPLATE_ASSISTANT_HEADER);
    if (m->reasoning) n += strlen(m->reasoning) + strlen(TEMPLATE_THINK_OPEN) + strlen(TEMPLATE_THINK_CLOSE);
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) fatal("usage: bench_tokenize TOKENIZER [FILE.jsonl]");
    const char *data_path = argc == 3 ? argv[2] : "datasets/synthetic/train.jsonl";
    char err[1024];
    Tokenizer *tok = tokenizer_load(argv[1], err, sizeof err);
    if (!tok) fatal("%s", err);
    if (template_check_tokenizer(tok, err, sizeof err) != 0) fatal("%s: %s", argv[1], err);
    Dataset d;
    dataset_load(data_path, &(LoadOptions){0}, &d);
    size_t bytes = 0;
    for (int s = 0; s < d.n_samples; s++) {
        for (int m = 0; m < d.samples[s].n_messages; m++) bytes += message_bytes(&d.samples[s].messages[m]);
        for (int c = 0; c < d.samples[s].n_completions; c++) bytes += message_bytes(&d.samples[s].completions[c]);
    }
    double best = 1e30;
    long long n_ids = 0;
    for (int run = 0; run < 3; run++) {
        n_ids = 0;
        double t0 = seconds();
        for (int s = 0; s < d.n_samples; s++) {
            TokenizedSample ts;
            if (sample_tokenize(tok, &d.samples[s], SPECIAL_IN_TEXT_PLAIN, &ts, err, sizeof err) != 0)
                fatal("%s:%d: %s", data_path, d.samples[s].line, err);
            for (int t = 0; t < ts.n_turns; t++)
                n_ids += ts.turns[t].prompt.n + ts.turns[t].think.n + ts.turns[t].answer.n;
            n_ids += ts.prefix.n;
            tokenized_sample_free(&ts);
        }
        double dt = seconds() - t0;
        if (dt < best) best = dt;
    }
    printf("%s: vocab %d, %s: %d samples, %.2f MB of text, %lld ids, best of 3: %.3f s, %.1f MB/s, "
           "%.2f M ids/s\n", argv[1], tokenizer_vocab_size(tok), data_path, d.n_samples, (double)bytes / 1e6,
           n_ids, best, (double)bytes / 1e6 / best, (double)n_ids / 1e6 / best);
    dataset_free(&d);
    tokenizer_free(tok);
    return 0;
}
