// `train pack`: lay out and pack a data set, write the rows as JSONL, print statistics.
// Output (a public interface, keep it stable): one JSON object per packed row,
//   {"tokens": [...], "targets": [...], "pos": [...], "lo": [...], "hi": [...],
//    "doc": [...], "turn": [...], "role": [...]}
// each array of length data.seq_len: the columns of data/token_columns.h, in its order.
// --show LINE also prints that line's documents as packed, token by token (cli/pack_show.h).
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/pack_show.h"
#include "common/check.h"
#include "common/output_file.h"
#include "trainer/config.h"
#include "trainer/data_options.h"
#include "trainer/data_stats.h"
#include "trainer/setup.h"

static void write_array(FILE *f, const char *name, const int32_t *values, int n, bool last) {
    fprintf(f, "\"%s\": [", name);
    for (int i = 0; i < n; i++) fprintf(f, i ? ", %d" : "%d", values[i]);
    fputs(last ? "]" : "], ", f);
}

// Writes through common/output_file.h: a regular file is replaced atomically (an error
// never leaves a half-written output), a device or FIFO is written in place, an input
// of the run is refused.
static void write_rows(const PackedRows *rows, const char *path) {
    OutputFile out;
    char err[1024];
    if (output_open(&out, path, err, sizeof err) != 0) fatal("%s", err);
    FILE *f = out.f;
    for (int r = 0; r < rows->n_rows; r++) {
        size_t base = (size_t)r * (size_t)rows->seq_len;
        const struct {
            const char *name;
            const int32_t *values;
        } fields[] = {
#define JSON_FIELD(field, json_name, ...) {json_name, rows->field},
            TOKEN_COLUMNS(JSON_FIELD)
#undef JSON_FIELD
        };
        int n_fields = (int)(sizeof fields / sizeof *fields);
        fputc('{', f);
        for (int i = 0; i < n_fields; i++)
            write_array(f, fields[i].name, fields[i].values + base, rows->seq_len, i == n_fields - 1);
        fputs("}\n", f);
    }
    if (output_commit(&out, err, sizeof err) != 0) fatal("%s", err);
}

int cmd_pack(int argc, char **argv) {
    // Configuration first, so its errors come before anything else.
    RunConfig *config = config_load_args(&argc, argv);

    const char *out_path = NULL;
    bool skip_bad_flag = false;
    int show_line = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out_path = argv[++i];
        } else if (strcmp(argv[i], "--skip-bad") == 0) {
            skip_bad_flag = true;
        } else if (strcmp(argv[i], "--show") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || v < 1 || v > 1000000000)
                fatal("pack: --show wants a line number of data.train_path (1, 2, ...), got '%s'",
                      argv[i]);
            show_line = (int)v;
        } else {
            fatal("pack: unexpected argument '%s' (usage: train pack --config FILE "
                  "[--set key=value]... --out rows.jsonl [--skip-bad] [--show LINE])", argv[i]);
        }
    }
    if (!out_path) fatal("pack: --out rows.jsonl is required");

    DataOptions opt = data_options_from_config(config);
    opt.skip_bad |= skip_bad_flag;
    long long tile = config->data.stats_block;
    if (tile <= 0 || tile > 4096)
        fatal("config key 'data.stats_block': must be in 1..4096, got %lld", tile);
    const char *tokenizer_path = config->data.tokenizer;
    const char *data_path = config->data.train_path;
    if (!tokenizer_path) fatal("config key 'data.tokenizer' is required");
    if (!data_path) fatal("config key 'data.train_path' is required");

    Tokenizer *tok = tokenizer_with_added(config);
    PackedDataset data;
    packed_dataset_load(tok, data_path, opt, &data);
    write_rows(&data.rows, out_path);

    DatasetStats stats;
    stats_compute(data.samples, data.n_samples, opt.layout, &opt.loss, &data.docs, &data.rows, (int)tile,
                  &stats);
    stats.n_skipped_bad = data.n_skipped_bad;
    stats.n_skipped_too_long = data.n_skipped_too_long;
    stats.keep_thinking = opt.chat_template && opt.chat_template->keep_thinking;
    printf("%s -> %s\n", data_path, out_path);
    printf("tokenizer %s, chat template %s\n", tokenizer_path, opt.chat_template->name);
    stats_print(&stats, stdout);
    if (show_line && pack_show_sample(&data, tok, show_line, stdout) == 0)
        fatal("pack: --show %d: no sample of %s comes from line %d (a blank, skipped or "
              "missing line)", show_line, data_path, show_line);

    packed_dataset_free(&data);
    tokenizer_free(tok);
    config_free(config);
    return 0;
}
