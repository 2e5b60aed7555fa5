// `train show`: draws what each layout does to one conversation (or shared-prefix set) of
// data.train_path, or with --rows to a packed row of several: the token strip, the
// attention mask, its tiles of ATTN_TILE and, for the one-pass layouts, the pairs that
// differ from the N-pass views (cli/show_draw.h). Prints `train pack`'s statistics of
// the same rows and the tile counts of the row drawn.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "attention/mask.h"
#include "cli/commands.h"
#include "cli/show_draw.h"
#include "cli/stats.h"
#include "common/check.h"
#include "trainer/config.h"
#include "trainer/data_options.h"
#include "trainer/setup.h"

// --rows: the conversations from the one named on, this many at most.
enum { ROWS_SAMPLES = 16 };

// One layout's documents and rows of the selected samples, and the row drawn (row 0).
typedef struct {
    DocList docs;
    PackedRows rows;
    uint8_t *kinds;  // [n_tiles, n_tiles] of row 0
    uint8_t *pairs;  // [seq_len, seq_len] of row 0, or NULL
    ShowRow show;
} LayoutView;

static const char USAGE[] = "usage: train show --config FILE [--set key=value]... --conversation N "
                            "--out DIR [--rows]";

// Tokenizes the samples from line `line` of `path` on, `count` at most.
static TokenizedSample *load_samples(const Tokenizer *tok, const char *path, int line, int count,
                                     const DataOptions *opt, int *n_out) {
    Dataset data;
    const LoadOptions load = data_load_options(opt);
    dataset_load(path, &load, &data);
    int first = 0;
    while (first < data.n_samples && data.samples[first].line != line) first++;
    if (first == data.n_samples)
        fatal("show: --conversation %d: %s has no sample on line %d", line, path, line);
    if (count > data.n_samples - first) count = data.n_samples - first;
    TokenizedSample *samples = xcalloc((size_t)count, sizeof(TokenizedSample));
    char why[1024], message[1200];
    for (int i = 0; i < count; i++) {
        if (sample_tokenize(tok, opt->chat_template ? opt->chat_template : &TEMPLATE_ONEPASS, &data.samples[first + i], opt->special_in_text, &samples[i], why,
                            sizeof why) != 0) {
            fail_at(message, sizeof message, path, data.samples[first + i].line, "%s", why);
            fatal("%s", message);
        }
    }
    dataset_free(&data);
    *n_out = count;
    return samples;
}

// Lays out and packs the samples under `layout`; false when the layout does not apply.
static bool layout_view(LayoutKind layout, const TokenizedSample *samples, int n_samples,
                        DataOptions opt, const char *caption, LayoutView *v) {
    memset(v, 0, sizeof *v);
    char err[1024];
    for (int s = 0; s < n_samples; s++) {
        if (layout_sample(layout, &opt.loss, &samples[s], s, &v->docs, err, sizeof err) != 0) {
            printf("%-22s %s (%s: not drawn)\n\n", "layout", layout_name(layout), err);
            doc_list_free(&v->docs);
            return false;
        }
    }
    int n_skipped;
    if (pack_docs(&v->docs, opt.seq_len, opt.pack, &v->rows, &n_skipped, err, sizeof err) != 0)
        fatal("show: %s: %s", layout_name(layout), err);
    DatasetStats stats;
    stats_compute(samples, n_samples, layout, &opt.loss, &v->docs, &v->rows, ATTN_TILE, &stats);
    stats.n_skipped_too_long = n_skipped;
    stats_print(&stats, stdout);

    int seq_len = v->rows.seq_len, n_tiles = (seq_len + ATTN_TILE - 1) / ATTN_TILE;
    ShowRow *r = &v->show;
    *r = (ShowRow){.layout = layout, .caption = caption, .n_rows = v->rows.n_rows,
                   .seq_len = seq_len, .tile = ATTN_TILE};
#define ROW_COLUMN(field, ...) r->field = v->rows.field;
    TOKEN_COLUMNS(ROW_COLUMN)
#undef ROW_COLUMN
    v->kinds = xmalloc((size_t)n_tiles * (size_t)n_tiles);
    tile_classify(r->lo, r->hi, seq_len, ATTN_TILE, ATTN_TILE, v->kinds);
    for (int i = 0; i < n_tiles * n_tiles; i++) r->tiles[v->kinds[i]]++;
    r->kinds = v->kinds;
    long long total = r->tiles[TILE_EMPTY] + r->tiles[TILE_PARTIAL] + r->tiles[TILE_FULL];
    printf("%-22s row 1 of %d: empty %lld  partial %lld  full %lld  (%lld tiles, %.1f%% skipped)\n",
           "drawn", v->rows.n_rows, r->tiles[TILE_EMPTY], r->tiles[TILE_PARTIAL],
           r->tiles[TILE_FULL], total, 100.0 * (double)r->tiles[TILE_EMPTY] / (double)total);
    if (layout != LAYOUT_NPASS) {
        v->pairs = xmalloc((size_t)seq_len * (size_t)seq_len);
        pair_kinds_against_npass(samples, &v->docs, &v->rows, 0, v->pairs, &r->pair_counts);
        r->pairs = v->pairs;
        printf("%-22s %lld of %lld visible pairs differ; %d of %d trained positions inexact\n",
               "against npass", r->pair_counts.differ, r->pair_counts.visible,
               r->pair_counts.trained_differ, r->pair_counts.trained);
    }
    return true;
}

static void layout_view_free(LayoutView *v) {
    doc_list_free(&v->docs);
    packed_rows_free(&v->rows);
    free(v->kinds);
    free(v->pairs);
}

typedef struct {
    const char *out_dir;
    int line;      // --conversation: the sample's line in data.train_path
    bool several;  // --rows
} ShowArgs;

// The arguments left after --config/--set.
static ShowArgs parse_args(int argc, char **argv) {
    ShowArgs a = {0};
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) a.out_dir = argv[++i];
        else if (strcmp(argv[i], "--conversation") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1 << 30)
                fatal("show: --conversation wants a line number (1, 2, ...), got '%s'", argv[i]);
            a.line = (int)v;
        } else if (strcmp(argv[i], "--rows") == 0) a.several = true;
        else fatal("show: unexpected argument '%s' (%s)", argv[i], USAGE);
    }
    if (!a.out_dir || a.line == 0)
        fatal("show: --conversation N and --out DIR are required (%s)", USAGE);
    return a;
}

int cmd_show(int argc, char **argv) {
    // Configuration first, so its errors come before anything else.
    const char *config_path;
    char **overrides;
    int n_overrides;
    int n_rest = config_take_args(argc, argv, &config_path, &overrides, &n_overrides);
    RunConfig *config = config_load(config_path, n_overrides, overrides);
    free(overrides);
    ShowArgs args = parse_args(n_rest, argv);
    if (mkdir(args.out_dir, 0777) != 0 && errno != EEXIST)
        fatal("show: cannot create %s: %s", args.out_dir, strerror(errno));

    DataOptions opt = data_options_from_config(config);
    const char *data_path = config->data.train_path;
    if (!data_path) fatal("config key 'data.train_path' is required");
    Tokenizer *tok = tokenizer_with_added(config);
    model_config_with(config, tok);  // fatal when the tokenizer does not fit the model
    int line = args.line, n_samples;
    TokenizedSample *samples = load_samples(tok, data_path, line, args.several ? ROWS_SAMPLES : 1,
                                            &opt, &n_samples);

    char caption[256];
    const char *what = samples[0].kind == SAMPLE_SHARED_PREFIX ? "set" : "conversation";
    if (args.several)
        snprintf(caption, sizeof caption, "%ss %d-%d packed", what, line, line + n_samples - 1);
    else
        snprintf(caption, sizeof caption, "%s %d (%d %s)", what, line, samples[0].n_turns,
                 samples[0].kind == SAMPLE_SHARED_PREFIX ? "completions" : "turns");
    printf("%s line %d: %s; seq_len %d, tiles %dx%d\n\n", data_path, line, caption, opt.seq_len,
           ATTN_TILE, ATTN_TILE);

    LayoutView views[4];
    ShowRow shown[4];
    int n_shown = 0;
    for (int layout = LAYOUT_NPASS; layout <= LAYOUT_SHARED_PREFIX; layout++) {
        LayoutView *v = &views[n_shown];
        if (!layout_view((LayoutKind)layout, samples, n_samples, opt, caption, v)) continue;
        show_draw_row(args.out_dir, &v->show);
        printf("%-22s %s/%s_{strip,mask,tiles%s}.{png,svg}\n\n", "figures", args.out_dir,
               layout_name((LayoutKind)layout), v->pairs ? ",diff" : "");
        shown[n_shown++] = v->show;
    }
    char title[512];
    snprintf(title, sizeof title, "onepass layouts: %s of %s (seq_len %d, tiles %dx%d)", caption,
             data_path, opt.seq_len, ATTN_TILE, ATTN_TILE);
    show_draw_overview(args.out_dir, title, shown, n_shown);
    printf("%-22s %s/overview.{png,svg}\n", "overview", args.out_dir);
    show_draw_finish();

    for (int i = 0; i < n_shown; i++) layout_view_free(&views[i]);
    for (int i = 0; i < n_samples; i++) tokenized_sample_free(&samples[i]);
    free(samples);
    tokenizer_free(tok);
    config_free(config);
    return 0;
}
