// Parity of the layouts (trainer/parity.h): one forward+backward of the same conversations with the same weights
// under each layout, on the configured backend, compared with npass (the reference).
// duplicate and shared_prefix are exact (differences are fp32 rounding on the CPU, bf16
// rounding on the GPU); mask_only is not, and its difference is reported so the
// comparison visibly can fail. Per tensor: relative L2 difference and cosine similarity.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/vec_math.h"
#include "trainer/data_options.h"
#include "trainer/backend.h"
#include "trainer/backend_registry.h"
#include "trainer/loader.h"
#include "trainer/parity.h"
#include "trainer/run.h"
#include "trainer/setup.h"
#include "trainer/step.h"

typedef struct {
    LayoutKind layout;
    double loss;
    long long tokens, trained;
    float *grads;  // [table.total]
} LayoutRun;

// The parity's model on the chosen backend, holding the shared weights.
typedef struct {
    const TrainBackendOps *ops;
    void *trainer;
} ParityModel;

static void run_layout(const RunConfig *c, const Tokenizer *tok, const ParamTable *table,
                       const ParityModel *model, LayoutKind layout, int *n_samples,
                       SampleKind *kind, LayoutRun *out) {
    DataOptions opt = data_options_from_config(c);
    opt.layout = layout;
    opt.max_samples = (int)c->parity.conversations;
    if (opt.max_samples <= 0) fatal("config key 'parity.conversations': must be positive");
    const char *path = c->data.train_path;
    if (!path) fatal("config key 'data.train_path': a JSONL file is required");
    PackedDataset data;
    packed_dataset_load(tok, path, opt, &data);
    if (*n_samples >= 0 && data.n_samples != *n_samples)
        fatal("parity: layout %s kept %d samples but npass %d (data.skip_bad skipped different "
              "samples); fix or remove the bad samples", layout_name(layout), data.n_samples,
              *n_samples);
    *n_samples = data.n_samples;
    *kind = data.samples[0].kind;
    for (int i = 1; i < data.n_samples; i++)
        if (data.samples[i].kind != *kind)
            fatal("parity: %s mixes conversations and shared-prefix sets (line %d); use one kind",
                  path, data.samples[i].line);

    out->layout = layout;
    packed_rows_count(&data.rows, &out->tokens, &out->trained);
    if (out->trained == 0) fatal("parity: no trained token under layout %s", layout_name(layout));
    MicroBatches micro;
    micro_batches_build(&data.rows, (int)c->train.micro_rows, &micro);
    const double sum = train_step_forward_backward(model->ops, model->trainer, &micro,
                                                   (float)(1.0 / (double)out->trained));
    out->loss = sum / (double)out->trained;
    out->grads = xmalloc(table->total * sizeof(float));
    model->ops->get_grads(model->trainer, out->grads);
    micro_batches_free(&micro);
    packed_dataset_free(&data);
}

// |a - b| / |b| over one tensor's elements (|a - b| itself when b is all zeros).
static double rel_diff(const float *a, const float *b, size_t n) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        diff += d * d;
        ref += (double)b[i] * b[i];
    }
    return ref > 0 ? sqrt(diff / ref) : sqrt(diff);
}

static json_t *layout_json(const LayoutRun *run, const LayoutRun *npass, const ParamTable *table) {
    json_t *o = json_pack("{s:f, s:I, s:I}", "loss", run->loss, "tokens", (json_int_t)run->tokens,
                          "trained_tokens", (json_int_t)run->trained);
    if (run == npass) return o;
    json_object_set_new(o, "loss_rel_diff", json_real(fabs(run->loss - npass->loss) / fabs(npass->loss)));
    json_t *per_tensor = json_object(), *per_tensor_cosine = json_object();
    double max = 0, min_cosine = 1;
    const char *max_name = table->tensors[0].name, *min_cosine_name = table->tensors[0].name;
    for (int t = 0; t < table->n_tensors; t++) {
        const ParamTensor *pt = &table->tensors[t];
        const double d = rel_diff(run->grads + pt->offset, npass->grads + pt->offset, pt->numel);
        const double cs = cosine_similarity(run->grads + pt->offset, npass->grads + pt->offset, pt->numel);
        json_object_set_new(per_tensor, pt->name, json_real(d));
        json_object_set_new(per_tensor_cosine, pt->name, json_real(cs));
        if (d > max || t == 0) {
            max = d;
            max_name = pt->name;
        }
        if (cs < min_cosine || t == 0) {
            min_cosine = cs;
            min_cosine_name = pt->name;
        }
    }
    json_object_set_new(o, "grad_rel_diff_max", json_real(max));
    json_object_set_new(o, "grad_rel_diff_max_tensor", json_string(max_name));
    json_object_set_new(o, "grad_cosine_min", json_real(min_cosine));
    json_object_set_new(o, "grad_cosine_min_tensor", json_string(min_cosine_name));
    json_object_set_new(o, "grad_rel_diff", per_tensor);
    json_object_set_new(o, "grad_cosine", per_tensor_cosine);
    return o;
}

json_t *parity_report(const RunConfig *c) {
    Tokenizer *tok = tokenizer_with_added(c);
    ModelConfig mc = model_config_with(c, tok);
    char why[512];
    const Backend backend = backend_choose(c->backend, &mc, why, sizeof why);
    printf("%s\n", why);
    ParamTable table;
    param_table_build(&mc, &table);
    float *params = xmalloc(table.total * sizeof(float));  // [table.total]
    const char *weights = c->parity.weights;
    if (!weights) weights = c->model.init_from;
    params_load_or_init(&mc, &table, weights, (uint64_t)c->seed, params);
    AdamWState opt;  // unused by one forward+backward, but part of the backend's state
    adamw_init(&opt, table.total);
    const long long micro_rows = c->train.micro_rows;
    if (micro_rows <= 0 || micro_rows > (1 << 20)) fatal("config key 'train.micro_rows': must be positive");
    const DataOptions data_opt = data_options_from_config(c);
    const BackendSetup setup = {.mc = &mc, .table = &table, .micro_rows = (int)micro_rows,
                                .seq_len = data_opt.seq_len,
                                .deterministic = c->train.deterministic,
                                .recompute = run_recompute_from(c)};
    ParityModel model = {.ops = backend_ops(backend)};
    model.trainer = model.ops->create(&setup);
    model.ops->set_state(model.trainer, params, &opt);

    LayoutRun runs[3];
    int n_runs = 0, n_samples = -1;
    SampleKind kind;
    run_layout(c, tok, &table, &model, LAYOUT_NPASS, &n_samples, &kind, &runs[n_runs++]);
    const LayoutKind conversation_layouts[] = {LAYOUT_DUPLICATE, LAYOUT_MASK_ONLY};
    const LayoutKind shared_layouts[] = {LAYOUT_SHARED_PREFIX};
    const bool shared = kind == SAMPLE_SHARED_PREFIX;
    const LayoutKind *others = shared ? shared_layouts : conversation_layouts;
    const int n_others = shared ? 1 : 2;
    for (int i = 0; i < n_others; i++) {
        SampleKind k;
        run_layout(c, tok, &table, &model, others[i], &n_samples, &k, &runs[n_runs++]);
    }

    json_t *layouts = json_object();
    for (int i = 0; i < n_runs; i++)
        json_object_set_new(layouts, layout_name(runs[i].layout), layout_json(&runs[i], &runs[0], &table));
    json_t *report = json_pack("{s:s, s:i, s:s, s:o}", "backend", model.ops->name, "samples",
                               n_samples, "kind", shared ? "shared_prefix" : "conversation",
                               "layouts", layouts);
    for (int i = 0; i < n_runs; i++) free(runs[i].grads);
    model.ops->destroy(model.trainer);
    adamw_free(&opt);
    free(params);
    param_table_free(&table);
    tokenizer_free(tok);
    return report;
}

void parity_print(const json_t *report, FILE *f) {
    fprintf(f, "parity over %lld %s samples on %s (npass is the reference)\n",
            (long long)json_integer_value(json_object_get(report, "samples")),
            json_string_value(json_object_get(report, "kind")),
            json_string_value(json_object_get(report, "backend")));
    fprintf(f, "%-14s %9s %9s %12s %14s %14s %11s  %s\n", "layout", "tokens", "trained", "loss",
            "loss_rel_diff", "grad_rel_max", "cosine_min", "worst tensor (rel)");
    const char *name;
    json_t *l;
    json_object_foreach((json_t *)json_object_get(report, "layouts"), name, l) {
        fprintf(f, "%-14s %9lld %9lld %12.8f", name,
                (long long)json_integer_value(json_object_get(l, "tokens")),
                (long long)json_integer_value(json_object_get(l, "trained_tokens")),
                json_real_value(json_object_get(l, "loss")));
        if (json_object_get(l, "loss_rel_diff"))
            fprintf(f, " %14.3e %14.3e %11.6f  %s",
                    json_real_value(json_object_get(l, "loss_rel_diff")),
                    json_real_value(json_object_get(l, "grad_rel_diff_max")),
                    json_real_value(json_object_get(l, "grad_cosine_min")),
                    json_string_value(json_object_get(l, "grad_rel_diff_max_tensor")));
        fputc('\n', f);
    }
}
