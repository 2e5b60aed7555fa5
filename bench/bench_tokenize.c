// Benchmark (not a test) of tokenization on one thread: every sample of a JSONL file
// through sample_tokenize (the template's segments, text fields encoded plain), as the
// data loader runs it. Throughput counts the bytes of the rendered segments (each
// segment once: shared prompts are not counted per view). Best of 3 runs.
//   bench_tokenize TOKENIZER [FILE.jsonl [TEMPLATE]]
//   (defaults: datasets/synthetic/train.jsonl, onepass)
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
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

static size_t segment_bytes(const RenderedSegment *s) {
    char *text = segment_text(s);
    size_t n = strlen(text);
    free(text);
    return n;
}

static size_t rendered_bytes(const ChatTemplate *t, const Sample *s) {
    RenderedSample r;
    char err[1024];
    if (template_render(t, s, SPECIAL_IN_TEXT_PLAIN, &r, err, sizeof err) != 0) fatal("line %d: %s", s->line, err);
    size_t n = segment_bytes(&r.prefix);
    for (int i = 0; i < r.n_turns; i++)
        n += segment_bytes(&r.turns[i].prompt) + segment_bytes(&r.turns[i].think) + segment_bytes(&r.turns[i].answer);
    rendered_sample_free(&r);
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) fatal("usage: bench_tokenize TOKENIZER [FILE.jsonl [TEMPLATE]]");
    const char *data_path = argc >= 3 ? argv[2] : "datasets/synthetic/train.jsonl";
    const ChatTemplate *t = argc == 4 ? template_by_name(argv[3]) : &TEMPLATE_ONEPASS;
    if (!t) fatal("unknown template '%s' (%s)", argv[3], template_names());
    char err[1024];
    Tokenizer *tok = tokenizer_load(argv[1], err, sizeof err);
    if (!tok) fatal("%s", err);
    if (template_check_tokenizer(tok, t, err, sizeof err) != 0) fatal("%s: %s", argv[1], err);
    Dataset d;
    dataset_load(data_path, &(LoadOptions){0}, &d);
    size_t bytes = 0;
    for (int s = 0; s < d.n_samples; s++) bytes += rendered_bytes(t, &d.samples[s]);
    double best = 1e30;
    long long n_ids = 0;
    for (int run = 0; run < 3; run++) {
        n_ids = 0;
        double t0 = seconds();
        for (int s = 0; s < d.n_samples; s++) {
            TokenizedSample ts;
            if (sample_tokenize(tok, t, &d.samples[s], SPECIAL_IN_TEXT_PLAIN, &ts, err, sizeof err) != 0)
                fatal("%s:%d: %s", data_path, d.samples[s].line, err);
            for (int t = 0; t < ts.n_turns; t++)
                n_ids += ts.turns[t].prompt.n + ts.turns[t].think.n + ts.turns[t].answer.n;
            n_ids += ts.prefix.n;
            tokenized_sample_free(&ts);
        }
        double dt = seconds() - t0;
        if (dt < best) best = dt;
    }
    printf("%s (%s template): vocab %d, %s: %d samples, %.2f MB of text, %lld ids, best of 3: %.3f s, %.1f MB/s, "
           "%.2f M ids/s\n", argv[1], t->name, tokenizer_vocab_size(tok), data_path, d.n_samples, (double)bytes / 1e6,
           n_ids, best, (double)bytes / 1e6 / best, (double)n_ids / 1e6 / best);
    dataset_free(&d);
    tokenizer_free(tok);
    return 0;
}
