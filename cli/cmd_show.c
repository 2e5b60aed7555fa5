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
#include "common/check.h"
#include "trainer/config.h"
#include "trainer/data_options.h"
#include "trainer/data_stats.h"
#include "trainer/layout_view.h"
#include "trainer/setup.h"

// --rows: the conversations from the one named on, this many at most.
enum { ROWS_SAMPLES = 16 };

static const char USAGE[] = "usage: train show --config FILE [--set key=value]... --conversation N "
                            "--out DIR [--rows]";

// Prints what v holds (trainer/layout_view.h) and the figures' row of it.
static ShowRow print_view(const LayoutView *v, const char *caption) {
    stats_print(&v->stats, stdout);
    const int seq_len = v->rows.seq_len;
    ShowRow r = {.layout = v->layout, .caption = caption, .n_rows = v->rows.n_rows,
                 .seq_len = seq_len, .tile = ATTN_TILE, .kinds = v->kinds, .pairs = v->pairs,
                 .pair_counts = v->pair_counts};
#define ROW_COLUMN(field, ...) r.field = v->rows.field;
    TOKEN_COLUMNS(ROW_COLUMN)
#undef ROW_COLUMN
    memcpy(r.tiles, v->tiles, sizeof r.tiles);
    long long total = r.tiles[TILE_EMPTY] + r.tiles[TILE_PARTIAL] + r.tiles[TILE_FULL];
    printf("%-22s row 1 of %d: empty %lld  partial %lld  full %lld  (%lld tiles, %.1f%% skipped)\n",
           "drawn", v->rows.n_rows, r.tiles[TILE_EMPTY], r.tiles[TILE_PARTIAL],
           r.tiles[TILE_FULL], total, 100.0 * (double)r.tiles[TILE_EMPTY] / (double)total);
    if (v->pairs)
        printf("%-22s %lld of %lld visible pairs differ; %d of %d trained positions inexact\n",
               "against npass", r.pair_counts.differ, r.pair_counts.visible,
               r.pair_counts.trained_differ, r.pair_counts.trained);
    return r;
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
    RunConfig *config = config_load_args(&argc, argv);
    ShowArgs args = parse_args(argc, argv);
    if (mkdir(args.out_dir, 0777) != 0 && errno != EEXIST)
        fatal("show: cannot create %s: %s", args.out_dir, strerror(errno));

    DataOptions opt = data_options_from_config(config);
    const char *data_path = config->data.train_path;
    if (!data_path) fatal("config key 'data.train_path' is required");
    Tokenizer *tok = tokenizer_with_added(config);
    model_config_with(config, tok);  // fatal when the tokenizer does not fit the model
    int line = args.line, n_samples;
    TokenizedSample *samples = samples_from_line(tok, data_path, line,
                                                 args.several ? ROWS_SAMPLES : 1, &opt, &n_samples);

    char caption[256];
    const char *what = samples[0].kind == SAMPLE_SHARED_PREFIX ? "set" : "conversation";
    if (args.several)
        snprintf(caption, sizeof caption, "%ss %d-%d packed", what, line, line + n_samples - 1);
    else
        snprintf(caption, sizeof caption, "%s %d (%d %s)", what, line, samples[0].n_turns,
                 samples[0].kind == SAMPLE_SHARED_PREFIX ? "completions" : "turns");
    printf("%s line %d: %s; seq_len %d, tiles %dx%d\n\n", data_path, line, caption, opt.seq_len,
           ATTN_TILE, ATTN_TILE);

    LayoutView views[6];
    ShowRow shown[6];
    int n_shown = 0;
    for (int layout = LAYOUT_NPASS; layout <= LAYOUT_PRESERVE; layout++) {
        LayoutView *v = &views[n_shown];
        char err[1024];
        if (layout_view_build((LayoutKind)layout, samples, n_samples, opt, v, err, sizeof err)) {
            printf("%-22s %s (%s: not drawn)\n\n", "layout", layout_name((LayoutKind)layout), err);
            continue;
        }
        shown[n_shown] = print_view(v, caption);
        show_draw_row(args.out_dir, &shown[n_shown]);
        printf("%-22s %s/%s_{strip,mask,tiles%s}.{png,svg}\n\n", "figures", args.out_dir,
               layout_name((LayoutKind)layout), v->pairs ? ",diff" : "");
        n_shown++;
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
