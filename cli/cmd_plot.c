// `train plot RUN_DIR [--out FILE.png]`: the run's curves from RUN_DIR/metrics.jsonl in
// one PNG (default RUN_DIR/curves.png), drawn with cairo as `train show`'s figures are:
// training loss with the eval losses, the learning rate, tokens/s, and the eval accuracy
// when the run generated. A panel per quantity against the step.
#define _DEFAULT_SOURCE  // getline, M_PI
#include <cairo.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/show_draw.h"
#include "common/check.h"

static const char USAGE[] = "usage: train plot RUN_DIR [--out FILE.png]";

enum { LOSS, EVAL_LOSS, EVAL_ANSWER_LOSS, LR, TOKENS_PER_S, ACCURACY, LATER_ACCURACY, N_SERIES };
static const char *const KEYS[N_SERIES] = {"loss", "eval_loss", "eval_answer_loss", "lr",
                                           "tokens_per_s", "eval_accuracy",
                                           "eval_later_turn_accuracy"};

// One quantity's points (step, value), in file order.
typedef struct {
    double *step, *value;
    int n, cap;
} Series;

static void series_add(Series *s, double step, double value) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->step = xrealloc(s->step, (size_t)s->cap * sizeof(double));
        s->value = xrealloc(s->value, (size_t)s->cap * sizeof(double));
    }
    s->step[s->n] = step;
    s->value[s->n++] = value;
}

// metrics.jsonl into the series; fatal, naming path:line, for a line that is not a JSON
// object with a step.
static void read_metrics(const char *path, Series *series) {
    FILE *f = fopen(path, "r");
    if (!f) fatal("train plot: %s: cannot open (a run folder holds metrics.jsonl)", path);
    char *line = NULL;
    size_t cap = 0;
    int number = 0;
    while (getline(&line, &cap, f) > 0) {
        number++;
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        const json_t *step = json_object_get(o, "step");
        if (!json_is_object(o) || !json_is_integer(step))
            fatal("%s:%d: not a metrics line (a JSON object with a step)", path, number);
        for (int k = 0; k < N_SERIES; k++) {
            const json_t *v = json_object_get(o, KEYS[k]);
            if (json_is_number(v) && isfinite(json_number_value(v)))
                series_add(&series[k], (double)json_integer_value(step), json_number_value(v));
        }
        json_decref(o);
    }
    free(line);
    fclose(f);
    if (series[LOSS].n == 0) fatal("train plot: %s has no step yet", path);
}

typedef struct {
    double r, g, b;
} Rgb;

enum { WIDTH = 960, PANEL = 230, LEFT = 80, RIGHT = 20, TOP = 30, BOTTOM = 40 };

// One panel at y0: the series (NULL-ended by n) against the step, x from 0 to last_step,
// y from their minimum to their maximum; a legend with each series' last value.
static void panel(cairo_t *cr, double y0, const char *title, const Series *const *s,
                  const char *const *names, const Rgb *colors, int n, double last_step) {
    const double x0 = LEFT, w = WIDTH - LEFT - RIGHT, top = y0 + TOP, h = PANEL - TOP - BOTTOM;
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < s[i]->n; j++) lo = fmin(lo, s[i]->value[j]), hi = fmax(hi, s[i]->value[j]);
    if (hi <= lo) hi = lo + (lo != 0 ? fabs(lo) * 0.1 : 1.0);
    cairo_set_source_rgb(cr, 0, 0, 0);
    draw_text(cr, x0, y0 + 18, 14, false, 0, "%s", title);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, x0, top, w, h);
    cairo_stroke(cr);
    draw_text(cr, x0 - 6, top + 10, 11, false, 1, "%.4g", hi);
    draw_text(cr, x0 - 6, top + h, 11, false, 1, "%.4g", lo);
    draw_text(cr, x0, top + h + 16, 11, false, 0, "0");
    draw_text(cr, x0 + w, top + h + 16, 11, false, 1, "step %.0f", last_step);
    double legend_x = x0 + w;
    for (int i = n - 1; i >= 0; i--) {
        if (s[i]->n == 0) continue;
        cairo_set_source_rgb(cr, colors[i].r, colors[i].g, colors[i].b);
        cairo_set_line_width(cr, s[i]->n > 1 ? 1.5 : 1);
        for (int j = 0; j < s[i]->n; j++) {
            const double x = x0 + w * s[i]->step[j] / last_step;
            const double y = top + h * (1 - (s[i]->value[j] - lo) / (hi - lo));
            if (j == 0) cairo_move_to(cr, x, y);
            else cairo_line_to(cr, x, y);
            if (s[i]->n < 50) cairo_arc(cr, x, y, 2.5, 0, 2 * M_PI), cairo_move_to(cr, x, y);
        }
        cairo_stroke(cr);
        char label[128];
        snprintf(label, sizeof label, "%s %.4g", names[i], s[i]->value[s[i]->n - 1]);
        cairo_text_extents_t e;
        cairo_set_font_size(cr, 12);
        cairo_text_extents(cr, label, &e);
        legend_x -= e.x_advance + 16;
        draw_text(cr, legend_x, y0 + 18, 12, false, 0, "%s", label);
    }
}

int cmd_plot(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) out = argv[++i];
        else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else fatal("train plot: unexpected argument '%s' (%s)", argv[i], USAGE);
    }
    if (!dir) fatal("train plot: RUN_DIR is required (%s)", USAGE);
    char path[4200], out_path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(out_path, sizeof out_path, "%s", out ? out : "");
    if (!out) snprintf(out_path, sizeof out_path, "%s/curves.png", dir);
    Series series[N_SERIES] = {0};
    read_metrics(path, series);
    const double last_step = series[LOSS].step[series[LOSS].n - 1];
    const bool accuracy = series[ACCURACY].n > 0;
    const int panels = accuracy ? 4 : 3;
    cairo_surface_t *surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, WIDTH, PANEL * panels);
    cairo_t *cr = cairo_create(surface);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    const Rgb blue = {0.12, 0.35, 0.75}, orange = {0.90, 0.45, 0.05}, green = {0.15, 0.60, 0.25};
    const Series *losses[] = {&series[LOSS], &series[EVAL_LOSS], &series[EVAL_ANSWER_LOSS]};
    panel(cr, 0, "loss", losses, (const char *const[]){"train", "eval", "eval answer"},
          (const Rgb[]){blue, orange, green}, 3, last_step);
    panel(cr, PANEL, "learning rate", (const Series *const[]){&series[LR]},
          (const char *const[]){"lr"}, (const Rgb[]){blue}, 1, last_step);
    panel(cr, 2 * PANEL, "tokens/s", (const Series *const[]){&series[TOKENS_PER_S]},
          (const char *const[]){"tokens/s"}, (const Rgb[]){blue}, 1, last_step);
    if (accuracy)
        panel(cr, 3 * PANEL, "eval accuracy", (const Series *const[]){&series[ACCURACY], &series[LATER_ACCURACY]},
              (const char *const[]){"all turns", "later turns"}, (const Rgb[]){blue, orange}, 2, last_step);
    cairo_destroy(cr);
    const cairo_status_t status = cairo_surface_write_to_png(surface, out_path);
    cairo_surface_destroy(surface);
    if (status != CAIRO_STATUS_SUCCESS)
        fatal("train plot: writing %s: %s", out_path, cairo_status_to_string(status));
    for (int k = 0; k < N_SERIES; k++) free(series[k].step), free(series[k].value);
    show_draw_finish();
    printf("train plot: %s: %d steps, %d evals -> %s\n", path, series[LOSS].n, series[EVAL_LOSS].n, out_path);
    return 0;
}
