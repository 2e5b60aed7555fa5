#include "cli/show_draw.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <fontconfig/fontconfig.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention/mask.h"
#include "common/check.h"

typedef struct {
    double r, g, b;
} Color;

static const Color ROLE_COLORS[] = {
    {0.30, 0.45, 0.69},  // ROLE_PROMPT
    {0.87, 0.52, 0.32},  // ROLE_THINK
    {0.33, 0.66, 0.41},  // ROLE_ANSWER
    {0.51, 0.45, 0.70},  // ROLE_ANSWER_HISTORY
};
static const Color PADDING = {0.89, 0.89, 0.89}, INK = {0.13, 0.13, 0.13},
                   MUTED = {0.45, 0.45, 0.45}, WHITE = {1, 1, 1};
static const Color TILE_COLORS[] = {
    {0.95, 0.95, 0.95},  // TILE_EMPTY
    {0.96, 0.76, 0.33},  // TILE_PARTIAL
    {0.18, 0.43, 0.71},  // TILE_FULL
};
static const Color PAIR_SAME_COLOR = {0.78, 0.80, 0.84}, PAIR_DIFFERS_COLOR = {0.80, 0.16, 0.18};

static Color role_color(int32_t role) { return role < 0 ? PADDING : ROLE_COLORS[role]; }
static void set_color(cairo_t *cr, Color c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

static const char *layout_title(LayoutKind layout) {
    switch (layout) {
    case LAYOUT_NPASS: return "npass (reference)";
    case LAYOUT_MASK_ONLY: return "mask_only (a)";
    case LAYOUT_DUPLICATE: return "duplicate (b)";
    case LAYOUT_SHARED_PREFIX: return "shared_prefix";
    case LAYOUT_AS_RENDERED: return "as_rendered (i)";
    case LAYOUT_PRESERVE: return "preserve (ii)";
    }
    return "unknown";
}

// "12,345"
static const char *grouped(long long v, char *buf, size_t len) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%lld", v < 0 ? -v : v), at = 0;
    if (v < 0 && at + 1 < (int)len) buf[at++] = '-';
    for (int i = 0; i < n && at + 2 < (int)len; i++) {
        if (i > 0 && (n - i) % 3 == 0) buf[at++] = ',';
        buf[at++] = digits[i];
    }
    buf[at] = '\0';
    return buf;
}

static double percent(long long part, long long whole) {
    return whole > 0 ? 100.0 * (double)part / (double)whole : 0.0;
}

double draw_text(cairo_t *cr, double x, double y, double size, bool bold, double align,
                 const char *fmt, ...) {
    char s[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s, sizeof s, fmt, ap);
    va_end(ap);
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - align * e.x_advance, y);
    cairo_show_text(cr, s);
    return e.x_advance;
}

static double text_width(cairo_t *cr, double size, bool bold, const char *s) {
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    return e.x_advance;
}

static void fill_rect(cairo_t *cr, double x, double y, double w, double h, Color c) {
    set_color(cr, c);
    cairo_rectangle(cr, x, y, w, h);
    cairo_fill(cr);
}

static void line(cairo_t *cr, double x0, double y0, double x1, double y1, double width, Color c,
                 double alpha) {
    cairo_set_source_rgba(cr, c.r, c.g, c.b, alpha);
    cairo_set_line_width(cr, width);
    cairo_move_to(cr, x0, y0);
    cairo_line_to(cr, x1, y1);
    cairo_stroke(cr);
}

// ---- segments: runs of slots with one (doc, turn, role) ----

typedef struct {
    int start, end;
    int32_t doc, turn, role;
    bool doc_start;  // the first segment of its document
} Segment;

static Segment *row_segments(const ShowRow *r, int *n_out) {
    Segment *segs = NULL;
    int n = 0, cap = 0;
    for (int i = 0; i < r->seq_len; i++) {
        if (n > 0 && segs[n - 1].doc == r->doc[i] && segs[n - 1].turn == r->turn[i] &&
            segs[n - 1].role == r->role[i]) {
            segs[n - 1].end = i + 1;
            continue;
        }
        Segment s = {i, i + 1, r->doc[i], r->turn[i], r->role[i],
                     r->doc[i] != -1 && (n == 0 || segs[n - 1].doc != r->doc[i])};
        ARRAY_PUSH(segs, n, cap, s);
    }
    *n_out = n;
    return segs;
}

// p1, th1, a1, a1A / a1B (duplicate's loss and history copies); a shared prefix is P.
static void segment_label(const ShowRow *r, const Segment *segs, int n, int i, char *buf,
                          size_t len) {
    const Segment *s = &segs[i];
    int number = r->layout == LAYOUT_SHARED_PREFIX ? s->turn : s->turn + 1;
    bool copied = false;  // an answer with a history copy in its (doc, turn)
    for (int j = 0; j < n; j++)
        copied |= segs[j].doc == s->doc && segs[j].turn == s->turn &&
                  segs[j].role == ROLE_ANSWER_HISTORY;
    switch (s->role) {
    case ROLE_PROMPT:
        if (r->layout == LAYOUT_SHARED_PREFIX) snprintf(buf, len, "P");
        else snprintf(buf, len, "p%d", number);
        break;
    case ROLE_THINK: snprintf(buf, len, "th%d", number); break;
    case ROLE_ANSWER: snprintf(buf, len, copied ? "a%dA" : "a%d", number); break;
    case ROLE_ANSWER_HISTORY: snprintf(buf, len, "a%dB", number); break;
    default: buf[0] = '\0';
    }
}

// ---- legend ----

typedef struct {
    Color color;
    const char *label;
} LegendItem;

// One line of swatches from (x, y), wrapping at x + w; returns the height used.
static double legend(cairo_t *cr, double x, double y, double w, double fs, const LegendItem *items,
                     int n) {
    double cx = x, cy = y, sw = fs * 1.1;
    for (int i = 0; i < n; i++) {
        double item_w = sw + fs * 0.4 + text_width(cr, fs, false, items[i].label) + fs * 1.4;
        if (cx > x && cx + item_w > x + w) {
            cx = x;
            cy += fs * 1.7;
        }
        fill_rect(cr, cx, cy - sw * 0.85, sw, sw, items[i].color);
        cairo_set_source_rgba(cr, 0, 0, 0, 0.35);
        cairo_set_line_width(cr, 0.8);
        cairo_rectangle(cr, cx, cy - sw * 0.85, sw, sw);
        cairo_stroke(cr);
        set_color(cr, INK);
        draw_text(cr, cx + sw + fs * 0.4, cy, fs, false, 0, "%s", items[i].label);
        cx += item_w;
    }
    return cy - y + fs * 1.7;
}

static int role_legend(const ShowRow *r, LegendItem *items) {
    int n = 0;
    items[n++] = (LegendItem){ROLE_COLORS[ROLE_PROMPT], "prompt"};
    items[n++] = (LegendItem){ROLE_COLORS[ROLE_THINK], "think"};
    items[n++] = (LegendItem){ROLE_COLORS[ROLE_ANSWER],
                              r->layout == LAYOUT_DUPLICATE ? "answer (loss copy A)" : "answer"};
    if (r->layout == LAYOUT_DUPLICATE)
        items[n++] = (LegendItem){ROLE_COLORS[ROLE_ANSWER_HISTORY], "answer (history copy B)"};
    items[n++] = (LegendItem){PADDING, "padding"};
    return n;
}

static double font_size(double w) { return fmin(15.0, fmax(11.0, w / 64.0)); }

static int real_slots(const ShowRow *r) {
    int n = 0;
    for (int i = 0; i < r->seq_len; i++) n += r->doc[i] != -1;
    return n;
}

static int row_docs(const Segment *segs, int n) {
    int docs = 0;
    for (int i = 0; i < n; i++) docs += segs[i].doc_start;
    return docs;
}

// ---- the token strip ----

static void paint_strip(cairo_t *cr, const void *what, double w, double h) {
    const ShowRow *r = what;
    double fs = font_size(w), x0 = fs * 2, bar_w = w - fs * 4, s = bar_w / r->seq_len;
    int n_segs;
    Segment *segs = row_segments(r, &n_segs);
    char a[32], b[32];
    set_color(cr, INK);
    draw_text(cr, x0, fs * 1.7, fs * 1.25, true, 0, "%s: %s, row %d of %d", layout_title(r->layout),
         r->caption, r->row + 1, r->n_rows);
    set_color(cr, MUTED);
    draw_text(cr, x0, fs * 3.3, fs, false, 0,
         "%s tokens in %s slots, %d document%s; coloured by segment, position ids under it",
         grouped(real_slots(r), a, sizeof a), grouped(r->seq_len, b, sizeof b),
         row_docs(segs, n_segs), row_docs(segs, n_segs) == 1 ? "" : "s");

    // Labels that do not fit inside their segment go to one of two lanes above the bar.
    double bar_y = fs * 7.2, bar_h = fs * 2.4, lane_end[2] = {-1e9, -1e9};
    for (int i = 0; i < n_segs; i++) {
        const Segment *g = &segs[i];
        fill_rect(cr, x0 + g->start * s, bar_y, (g->end - g->start) * s, bar_h, role_color(g->role));
    }
    if (s >= 3)  // token boundaries, where they can be seen
        for (int i = 1; i < r->seq_len; i++)
            line(cr, x0 + i * s, bar_y, x0 + i * s, bar_y + bar_h, 0.5, WHITE, 0.7);
    for (int i = 0; i < n_segs; i++) {
        const Segment *g = &segs[i];
        char label[32];
        segment_label(r, segs, n_segs, i, label, sizeof label);
        if (!label[0]) continue;
        double gx = x0 + g->start * s, gw = (g->end - g->start) * s, cx = gx + gw / 2;
        double tw = text_width(cr, fs, true, label);
        line(cr, gx, bar_y, gx, bar_y + bar_h, g->doc_start ? 2.5 : 1.0,
             g->doc_start ? INK : WHITE, 1.0);
        if (tw + 4 <= gw) {
            set_color(cr, WHITE);
            draw_text(cr, cx, bar_y + bar_h * 0.68, fs, true, 0.5, "%s", label);
            continue;
        }
        for (int lane = 0; lane < 2; lane++) {
            if (cx - tw / 2 < lane_end[lane] + fs * 0.3) continue;
            double ly = bar_y - fs * 0.5 - lane * fs * 1.3;
            set_color(cr, INK);
            draw_text(cr, cx, ly, fs * 0.9, true, 0.5, "%s", label);
            line(cr, cx, ly + fs * 0.2, cx, bar_y, 0.6, MUTED, 1.0);
            lane_end[lane] = cx + tw / 2;
            break;
        }
    }
    // Position ids: the first of each segment (and the last, where there is room).
    double pos_y = bar_y + bar_h + fs * 1.3, pos_end[2] = {-1e9, -1e9};
    for (int i = 0; i < n_segs; i++) {
        const Segment *g = &segs[i];
        if (g->doc == -1) continue;
        char label[32];
        if (g->end - g->start > 1)
            snprintf(label, sizeof label, "%d-%d", r->pos[g->start], r->pos[g->end - 1]);
        else snprintf(label, sizeof label, "%d", r->pos[g->start]);
        double tw = text_width(cr, fs * 0.85, false, label);
        double gx = fmin(x0 + g->start * s, x0 + bar_w - tw);  // the last one inside the panel
        for (int lane = 0; lane < 2; lane++) {
            if (gx < pos_end[lane] + fs * 0.4) continue;
            set_color(cr, INK);
            draw_text(cr, gx, pos_y + lane * fs * 1.15, fs * 0.85, false, 0, "%s", label);
            pos_end[lane] = gx + tw;
            break;
        }
    }
    // Position id against slot: restarts show where a layout repeats an inference view.
    double plot_y = pos_y + fs * 2.2, plot_h = h - plot_y - fs * 4.4;
    int max_pos = 1;
    for (int i = 0; i < r->seq_len; i++)
        if (r->doc[i] != -1 && r->pos[i] > max_pos) max_pos = r->pos[i];
    if (plot_h > fs * 2) {
        line(cr, x0, plot_y + plot_h, x0 + bar_w, plot_y + plot_h, 0.8, MUTED, 1.0);
        line(cr, x0, plot_y, x0, plot_y + plot_h, 0.8, MUTED, 1.0);
        set_color(cr, MUTED);
        draw_text(cr, x0 - fs * 0.3, plot_y + fs * 0.7, fs * 0.8, false, 1, "%d", max_pos);
        draw_text(cr, x0 - fs * 0.3, plot_y + plot_h, fs * 0.8, false, 1, "0");
        draw_text(cr, x0 + fs * 0.4, plot_y + fs * 0.7, fs * 0.8, false, 0, "position id per slot");
        cairo_set_line_width(cr, 1.6);
        for (int i = 0; i < n_segs; i++) {
            const Segment *g = &segs[i];
            if (g->doc == -1) continue;
            set_color(cr, role_color(g->role));
            for (int k = g->start; k < g->end; k++) {
                double px = x0 + (k + 0.5) * s, py = plot_y + plot_h * (1.0 - (double)r->pos[k] / max_pos);
                if (k == g->start) cairo_move_to(cr, px, py);
                else cairo_line_to(cr, px, py);
            }
            if (g->end - g->start == 1) cairo_rel_line_to(cr, 0.5, 0);
            cairo_stroke(cr);
        }
    }
    LegendItem items[6];
    int n_items = role_legend(r, items);
    items[n_items++] = (LegendItem){INK, "document boundary"};
    legend(cr, x0, h - fs * 2.4, bar_w, fs, items, n_items);
    free(segs);
}

// ---- square query x key panels ----

typedef struct {
    double x, y, size, scale;  // slot i of either axis at x (or y) + i * scale
} Plot;

static int tick_step(int seq_len) {
    int step = 16;
    while (seq_len / step > 8) step *= 2;
    return step;
}

// Titles, axes (keys across the top, queries down the left, each with the row's
// segments as a coloured bar), the legend below; returns where the grid goes.
static Plot grid_begin(cairo_t *cr, const ShowRow *r, double w, double h, const char *title,
                       const char *subtitle, const LegendItem *items, int n_items) {
    double fs = font_size(w);
    set_color(cr, INK);
    draw_text(cr, fs * 1.2, fs * 1.7, fs * 1.2, true, 0, "%s", title);
    set_color(cr, MUTED);
    draw_text(cr, fs * 1.2, fs * 3.2, fs * 0.95, false, 0, "%s", subtitle);
    double left = fs * 6.8, top = fs * 8.4, bottom = fs * 3.8;
    double size = fmin(w - left - fs * 1.5, h - top - bottom);
    Plot p = {left, top, size, size / r->seq_len};
    double bar = fs * 1.1, gap = fs * 0.25;
    int n_segs;
    Segment *segs = row_segments(r, &n_segs);
    for (int i = 0; i < n_segs; i++) {
        const Segment *g = &segs[i];
        double a = g->start * p.scale, len = (g->end - g->start) * p.scale;
        fill_rect(cr, p.x + a, p.y - gap - bar, len, bar, role_color(g->role));
        fill_rect(cr, p.x - gap - bar, p.y + a, bar, len, role_color(g->role));
        char label[32];
        segment_label(r, segs, n_segs, i, label, sizeof label);
        if (label[0] && text_width(cr, fs * 0.75, true, label) + 3 <= len) {
            set_color(cr, WHITE);
            draw_text(cr, p.x + a + len / 2, p.y - gap - bar * 0.25, fs * 0.75, true, 0.5, "%s", label);
        }
    }
    free(segs);
    int step = tick_step(r->seq_len);
    set_color(cr, MUTED);
    for (int t = 0; t <= r->seq_len; t += step) {
        double at = t * p.scale;
        line(cr, p.x + at, p.y - gap - bar, p.x + at, p.y - gap - bar - fs * 0.4, 0.8, MUTED, 1.0);
        set_color(cr, MUTED);
        draw_text(cr, p.x + at, p.y - gap - bar - fs * 0.6, fs * 0.8, false, 0.5, "%d", t);
        line(cr, p.x - gap - bar, p.y + at, p.x - gap - bar - fs * 0.4, p.y + at, 0.8, MUTED, 1.0);
        set_color(cr, MUTED);
        draw_text(cr, p.x - gap - bar - fs * 0.6, p.y + at + fs * 0.3, fs * 0.8, false, 1, "%d", t);
    }
    set_color(cr, INK);
    draw_text(cr, p.x + size / 2, p.y - gap - bar - fs * 2.0, fs, true, 0.5, "key slot k \xe2\x86\x92");
    cairo_save(cr);
    cairo_translate(cr, fs * 1.5, p.y + size / 2);
    cairo_rotate(cr, -M_PI / 2);
    draw_text(cr, 0, 0, fs, true, 0.5, "query slot q \xe2\x86\x92");
    cairo_restore(cr);
    legend(cr, p.x, p.y + size + fs * 2.0, w - p.x - fs, fs * 0.95, items, n_items);
    return p;
}

// Segment boundaries across the grid on both axes (documents darker), and the frame.
static void grid_end(cairo_t *cr, const ShowRow *r, Plot p) {
    int n_segs;
    Segment *segs = row_segments(r, &n_segs);
    for (int i = 1; i < n_segs; i++) {
        double at = segs[i].start * p.scale;
        bool doc = segs[i].doc_start || segs[i].doc == -1;
        double width = doc ? 1.2 : 0.6, alpha = doc ? 0.9 : 0.35;
        line(cr, p.x + at, p.y, p.x + at, p.y + p.size, width, INK, alpha);
        line(cr, p.x, p.y + at, p.x + p.size, p.y + at, width, INK, alpha);
    }
    free(segs);
    cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
    cairo_set_line_width(cr, 1.0);
    cairo_rectangle(cr, p.x, p.y, p.size, p.size);
    cairo_stroke(cr);
}

// Each key's visible queries are one interval: a column [lo, hi) per key, in the colour
// of the key's segment (alpha < 1: drawn over something).
static void paint_intervals(cairo_t *cr, const ShowRow *r, Plot p, bool by_role, double alpha) {
    cairo_save(cr);
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);  // adjacent columns without seams
    for (int k = 0; k < r->seq_len; k++) {
        int lo = r->lo[k] < 0 ? 0 : r->lo[k], hi = r->hi[k] > r->seq_len ? r->seq_len : r->hi[k];
        if (lo >= hi) continue;
        Color c = by_role ? role_color(r->role[k]) : INK;
        cairo_set_source_rgba(cr, c.r, c.g, c.b, alpha);
        cairo_rectangle(cr, p.x + k * p.scale, p.y + lo * p.scale, p.scale, (hi - lo) * p.scale);
        cairo_fill(cr);
    }
    cairo_restore(cr);
}

static long long visible_pairs(const ShowRow *r) {
    long long n = 0;
    for (int k = 0; k < r->seq_len; k++)
        if (r->hi[k] > r->lo[k]) n += r->hi[k] - r->lo[k];
    return n;
}

// Causal pairs among real slots of the same document: the dense work of the row.
static long long causal_pairs(const ShowRow *r) {
    long long n = 0;
    int run = 0;
    for (int i = 0; i < r->seq_len; i++) {
        run = r->doc[i] == -1 ? 0 : (i > 0 && r->doc[i - 1] == r->doc[i] ? run + 1 : 1);
        n += run;
    }
    return n;
}

static void paint_mask(cairo_t *cr, const void *what, double w, double h) {
    const ShowRow *r = what;
    char title[256], subtitle[256], a[32];
    snprintf(title, sizeof title, "%s: attention mask, row %d of %d", layout_title(r->layout),
             r->row + 1, r->n_rows);
    long long visible = visible_pairs(r), causal = causal_pairs(r);
    snprintf(subtitle, sizeof subtitle,
             "%s visible pairs (%.0f%% of causal); k is visible to q iff lo[k] <= q < hi[k]",
             grouped(visible, a, sizeof a), percent(visible, causal));
    LegendItem items[6];
    int n_items = role_legend(r, items);
    items[n_items - 1] = (LegendItem){WHITE, "hidden"};
    Plot p = grid_begin(cr, r, w, h, title, subtitle, items, n_items);
    paint_intervals(cr, r, p, true, 1.0);
    grid_end(cr, r, p);
}

static void paint_tiles(cairo_t *cr, const void *what, double w, double h) {
    const ShowRow *r = what;
    long long total = r->tiles[TILE_EMPTY] + r->tiles[TILE_PARTIAL] + r->tiles[TILE_FULL];
    char title[256], subtitle[256];
    snprintf(title, sizeof title, "%s: %d\xc3\x97%d tiles, %.1f%% of the tile work skipped",
             layout_title(r->layout), r->tile, r->tile, percent(r->tiles[TILE_EMPTY], total));
    snprintf(subtitle, sizeof subtitle,
             "row %d of %d: %lld empty, %lld partial, %lld full of %lld tiles (queries \xc3\x97 keys)",
             r->row + 1, r->n_rows, r->tiles[TILE_EMPTY], r->tiles[TILE_PARTIAL],
             r->tiles[TILE_FULL], total);
    const LegendItem items[] = {{TILE_COLORS[TILE_EMPTY], "empty: never loaded"},
                                {TILE_COLORS[TILE_PARTIAL], "partial: lo[k] <= q < hi[k] per element"},
                                {TILE_COLORS[TILE_FULL], "full: no mask work"},
                                {{0.80, 0.80, 0.80}, "visible pairs, shaded"}};
    Plot p = grid_begin(cr, r, w, h, title, subtitle, items, 4);
    int n_tiles = (r->seq_len + r->tile - 1) / r->tile;
    double ts = r->tile * p.scale;
    for (int qt = 0; qt < n_tiles; qt++)
        for (int kt = 0; kt < n_tiles; kt++) {
            double x = p.x + kt * ts, y = p.y + qt * ts;
            double tw = fmin(ts, p.x + p.size - x), th = fmin(ts, p.y + p.size - y);
            fill_rect(cr, x, y, tw, th, TILE_COLORS[r->kinds[(size_t)qt * n_tiles + kt]]);
        }
    paint_intervals(cr, r, p, false, 0.16);  // the mask, faintly, under the tile grid
    for (int t = 1; t < n_tiles; t++) {
        line(cr, p.x + t * ts, p.y, p.x + t * ts, p.y + p.size, 1.0, WHITE, 1.0);
        line(cr, p.x, p.y + t * ts, p.x + p.size, p.y + t * ts, 1.0, WHITE, 1.0);
    }
    cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
    cairo_set_line_width(cr, 1.0);
    cairo_rectangle(cr, p.x, p.y, p.size, p.size);
    cairo_stroke(cr);
}

static void paint_diff(cairo_t *cr, const void *what, double w, double h) {
    const ShowRow *r = what;
    const PairCounts *c = &r->pair_counts;
    char title[256], subtitle[256], a[32], b[32];
    snprintf(title, sizeof title, "%s against npass: %s of %s visible pairs differ",
             layout_title(r->layout), grouped(c->differ, a, sizeof a),
             grouped(c->visible, b, sizeof b));
    snprintf(subtitle, sizeof subtitle,
             "%d of %d trained positions see a context that their N-pass view does not have",
             c->trained_differ, c->trained);
    const LegendItem items[] = {{PAIR_SAME_COLOR, "visible, as in the inference view"},
                                {PAIR_DIFFERS_COLOR, "visible, but the key's context is not in the view"},
                                {WHITE, "hidden"}};
    Plot p = grid_begin(cr, r, w, h, title, subtitle, items, 3);
    int n = r->seq_len;
    cairo_save(cr);
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);
    for (int k = 0; k < n; k++) {  // runs of one class down each key's column
        int q = 0;
        while (q < n) {
            uint8_t kind = r->pairs[(size_t)q * n + k];
            int end = q + 1;
            while (end < n && r->pairs[(size_t)end * n + k] == kind) end++;
            if (kind != PAIR_HIDDEN) {
                set_color(cr, kind == PAIR_SAME ? PAIR_SAME_COLOR : PAIR_DIFFERS_COLOR);
                cairo_rectangle(cr, p.x + k * p.scale, p.y + q * p.scale, p.scale, (end - q) * p.scale);
                cairo_fill(cr);
            }
            q = end;
        }
    }
    cairo_restore(cr);
    grid_end(cr, r, p);
}

// The overview's stand-in for npass's comparison with itself.
static void paint_reference(cairo_t *cr, const void *what, double w, double h) {
    const ShowRow *r = what;
    double fs = font_size(w);
    set_color(cr, INK);
    draw_text(cr, fs * 1.2, fs * 1.7, fs * 1.2, true, 0, "%s", layout_title(r->layout));
    set_color(cr, MUTED);
    draw_text(cr, w / 2, h / 2 - fs, fs * 1.1, false, 0.5, "the reference: each turn in its own");
    draw_text(cr, w / 2, h / 2 + fs * 0.6, fs * 1.1, false, 0.5, "inference view; the other layouts");
    draw_text(cr, w / 2, h / 2 + fs * 2.2, fs * 1.1, false, 0.5, "are compared with these views");
}

// ---- files ----

typedef void (*Painter)(cairo_t *cr, const void *what, double w, double h);

static void paint_on(cairo_surface_t *surface, const char *path, Painter paint, const void *what,
                     double w, double h) {
    cairo_t *cr = cairo_create(surface);
    set_color(cr, WHITE);
    cairo_paint(cr);
    paint(cr, what, w, h);
    cairo_status_t status = cairo_status(cr);
    cairo_destroy(cr);
    if (status != CAIRO_STATUS_SUCCESS)
        fatal("%s: drawing failed: %s", path, cairo_status_to_string(status));
}

// DIR/NAME.png and DIR/NAME.svg, w x h (pixels; points in the SVG).
static void write_figure(const char *dir, const char *name, int w, int h, Painter paint,
                         const void *what) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.png", dir, name);
    cairo_surface_t *png = cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h);
    paint_on(png, path, paint, what, w, h);
    cairo_status_t status = cairo_surface_write_to_png(png, path);
    cairo_surface_destroy(png);
    if (status != CAIRO_STATUS_SUCCESS)
        fatal("%s: cannot write: %s", path, cairo_status_to_string(status));
    snprintf(path, sizeof path, "%s/%s.svg", dir, name);
    cairo_surface_t *svg = cairo_svg_surface_create(path, w, h);
    paint_on(svg, path, paint, what, w, h);
    cairo_surface_finish(svg);
    status = cairo_surface_status(svg);
    cairo_surface_destroy(svg);
    if (status != CAIRO_STATUS_SUCCESS)
        fatal("%s: cannot write: %s", path, cairo_status_to_string(status));
}

enum { STRIP_W = 1600, STRIP_H = 330, GRID_W = 900, GRID_H = 1000 };

void show_draw_row(const char *dir, const ShowRow *row) {
    const char *name = layout_name(row->layout);
    char file[128];
    struct {
        const char *suffix;
        int w, h;
        Painter paint;
    } figures[] = {{"strip", STRIP_W, STRIP_H, paint_strip},
                   {"mask", GRID_W, GRID_H, paint_mask},
                   {"tiles", GRID_W, GRID_H, paint_tiles},
                   {"diff", GRID_W, GRID_H, paint_diff}};
    int n_figures = row->pairs ? 4 : 3;
    for (int i = 0; i < n_figures; i++) {
        snprintf(file, sizeof file, "%s_%s", name, figures[i].suffix);
        write_figure(dir, file, figures[i].w, figures[i].h, figures[i].paint, row);
    }
}

typedef struct {
    const char *title;
    const ShowRow *rows;
    int n_rows;
} Overview;

enum { COLUMN_W = 620, HEADER_H = 64, OV_STRIP_H = 250, OV_GRID_H = 700 };

static void paint_overview(cairo_t *cr, const void *what, double w, double h) {
    const Overview *o = what;
    (void)h;
    set_color(cr, INK);
    draw_text(cr, 24, 40, 24, true, 0, "%s", o->title);
    const Painter grid_painters[] = {paint_mask, paint_tiles, paint_diff};
    for (int i = 0; i < o->n_rows; i++) {
        const ShowRow *r = &o->rows[i];
        double x = i * (w / o->n_rows), y = HEADER_H;
        cairo_save(cr);
        cairo_translate(cr, x, y);
        paint_strip(cr, r, COLUMN_W, OV_STRIP_H);
        cairo_translate(cr, 0, OV_STRIP_H);
        for (int g = 0; g < 3; g++) {
            Painter paint = g == 2 && !r->pairs ? paint_reference : grid_painters[g];
            paint(cr, r, COLUMN_W, OV_GRID_H);
            cairo_translate(cr, 0, OV_GRID_H);
        }
        cairo_restore(cr);
        if (i > 0) line(cr, x, HEADER_H, x, h - 10, 1.0, PADDING, 1.0);
    }
}

void show_draw_overview(const char *dir, const char *title, const ShowRow *rows, int n_rows) {
    Overview o = {title, rows, n_rows};
    write_figure(dir, "overview", COLUMN_W * n_rows, HEADER_H + OV_STRIP_H + 3 * OV_GRID_H,
                 paint_overview, &o);
}

void show_draw_finish(void) {
    cairo_debug_reset_static_data();
    FcFini();
}
