// `train show`'s figures, drawn with cairo: one packed row of a layout as a token strip,
// its attention mask, the mask at tile resolution and its pairs against npass; and an
// overview of several layouts side by side. PNG and SVG.
#pragma once
#include <cairo.h>
#include <stdbool.h>
#include <stdint.h>
#include "data/layout.h"
#include "trainer/slot_context.h"

// One packed row and what was computed about it. The columns are the row's slots.
typedef struct {
    LayoutKind layout;
    const char *caption;  // what the row holds, e.g. "conversation 7 (3 turns)"
    int row, n_rows, seq_len;
    const int32_t *token, *target, *pos, *lo, *hi, *doc, *turn, *role;  // [seq_len]
    int tile;                       // tile x tile
    const uint8_t *kinds;           // [n_tiles, n_tiles] TileKind of tile_classify
    long long tiles[3];             // tiles per TileKind
    const uint8_t *pairs;           // [seq_len, seq_len] PairKind; NULL: no comparison
    PairCounts pair_counts;
} ShowRow;

// Text whose anchor is (x, y) on the baseline, in DejaVu Sans; align 0 left, 0.5 centred,
// 1 right. Returns its width. (`train plot` draws its labels with it too.)
__attribute__((format(printf, 7, 8))) double draw_text(cairo_t *cr, double x, double y,
                                                       double size, bool bold, double align,
                                                       const char *fmt, ...);

// Writes DIR/<layout>_{strip,mask,tiles[,diff]}.{png,svg}; diff only when row->pairs.
void show_draw_row(const char *dir, const ShowRow *row);
// Writes DIR/overview.{png,svg}: the rows side by side, titled `title`.
void show_draw_overview(const char *dir, const char *title, const ShowRow *rows, int n_rows);
// Frees the font caches of cairo and fontconfig (after the last figure), so that the
// process ends with nothing allocated.
void show_draw_finish(void);
