// PEFT adapter folders (model/peft.h) against peft itself: the fixtures of tests/data/peft/
// (scripts/fixtures/make_peft_fixtures.py: random LoRA adapters saved by
// PeftModel.save_pretrained on the tiny model folders of tests/data/hf/, with the fp32
// logits of PEFT's forward). The CPU model with the adapter, and the base with the
// adapter merged, give PEFT's logits (<= 1e-5 relative) and loss; the config reads as the
// fixture script set it (written here, not read from the code under test); the folder
// onepass writes holds PEFT's tensor names and shapes, and its values bit for bit; what
// onepass cannot run (DoRA, a target_modules string, an extra tensor, a missing one) is
// refused by name.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/hf_export.h"
#include "model/lora.h"
#include "model/peft.h"
#include "tests/test_hf_util.h"
#include "tests/test_util.h"

typedef struct {
    const char *name, *base;
    LoraConfig want;  // as make_peft_fixtures.py sets it
} Fixture;

static const Fixture FIXTURES[] = {
    {"qwen3_all", "qwen3_qknorm_sharded", {.r = 4, .alpha = 8, .target = {1, 1, 1, 1, 1, 1, 1}}},
    {"qwen2_rslora", "qwen2_bias_bf16",
     {.r = 3, .alpha = 5, .rslora = true,
      .target = {[LORA_Q] = 1, [LORA_V] = 1, [LORA_DOWN] = 1}}},
};

// The logits of params (+ the adapter when lora is not NULL) on the fixture's reference
// row: their error relative to PEFT's, and the loss's.
static void errors(const ModelConfig *cfg, const float *params, const LoraLayout *lora,
                   const float *adapter, const HfReference *ref, double *logit_err,
                   double *loss_err) {
    const int S = ref->S, V = cfg->vocab_size;
    double *want = xmalloc((size_t)S * V * sizeof(double));
    for (size_t i = 0; i < (size_t)S * V; i++) want[i] = ref->logits[i];
    AttnMask mask;
    attn_mask_build(ref->lo, ref->hi, 1, S, 8, 8, &mask);
    const ModelBatch b = {1, S, ref->token, ref->target, ref->pos, &mask};
    CpuModel *m = cpu_model_create(cfg, 1, S, MODEL_RECOMPUTE_NONE);
    if (lora) cpu_model_set_lora(m, lora, adapter, NULL);
    float *logits = xmalloc((size_t)S * V * sizeof(float));
    cpu_model_logits(m, params, &b, logits);
    *logit_err = test_relative_error(logits, want, (size_t)S * V);
    const double loss = cpu_model_forward(m, params, &b, NULL) / ref->n_targets;
    *loss_err = fabs(loss - ref->loss) / ref->loss;
    cpu_model_free(m);
    attn_mask_free(&mask);
    free(want), free(logits);
}

// name -> shape of every tensor of a safetensors file, as "name:rows,cols;" sorted.
static int compare_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}
static char *key_set(const char *path) {
    SafeTensorsFile f;
    char err[512];
    CHECK(safetensors_read(path, &f, err, sizeof err) == 0, "%s", err);
    char **items = xmalloc((size_t)f.n_tensors * sizeof *items);
    size_t len = 1;
    for (int i = 0; i < f.n_tensors; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s:%lld,%lld;", f.tensors[i].name,
                 (long long)f.tensors[i].shape[0], (long long)f.tensors[i].shape[1]);
        items[i] = strdup(buf);
        len += strlen(buf);
    }
    qsort(items, (size_t)f.n_tensors, sizeof *items, compare_str);
    char *out = xcalloc(len, 1);
    for (int i = 0; i < f.n_tensors; i++) strcat(out, items[i]), free(items[i]);
    free(items);
    safetensors_file_free(&f);
    return out;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static void run_fixture(const Fixture *fx, const char *tmp) {
    char folder[512], base[512], err[1024], path[700], saved_base[512];
    snprintf(folder, sizeof folder, "tests/data/peft/%s", fx->name);
    snprintf(base, sizeof base, "tests/data/hf/%s", fx->base);
    HfModelConfig hf;
    ParamTable table;
    float *params = load_hf_folder(base, &hf, &table);
    LoraConfig lc;
    EXPECT(peft_is_adapter_folder(folder) && !peft_is_adapter_folder(base), "adapter folder test");
    EXPECT(peft_config_read(folder, &lc, saved_base, sizeof saved_base, err, sizeof err) == 0,
           "%s", err);
    EXPECT(lc.r == fx->want.r && lc.alpha == fx->want.alpha && lc.rslora == fx->want.rslora &&
               memcmp(lc.target, fx->want.target, sizeof lc.target) == 0,
           "%s: config r %d alpha %g rslora %d", fx->name, lc.r, lc.alpha, lc.rslora);
    EXPECT(strcmp(saved_base, base) == 0, "base_model_name_or_path '%s'", saved_base);
    LoraLayout l;
    lora_layout_build(&hf.cfg, &lc, &l);
    float *adapter = xmalloc(l.table.total * sizeof(float));
    EXPECT(peft_adapter_load(folder, &l, adapter, err, sizeof err) == 0, "%s", err);
    HfReference ref;
    hf_reference_load(folder, hf.cfg.vocab_size, &ref);

    double logit_err, loss_err;
    errors(&hf.cfg, params, &l, adapter, &ref, &logit_err, &loss_err);
    printf("%s: base + adapter: logits relative error %.3g, loss %.3g\n", fx->name, logit_err,
           loss_err);
    EXPECT(logit_err <= 1e-5 && loss_err <= 1e-6, "%s: logits %.3g, loss %.3g", fx->name,
           logit_err, loss_err);
    errors(&hf.cfg, params, NULL, NULL, &ref, &logit_err, &loss_err);
    EXPECT(logit_err > 1e-3, "%s: the base alone is within %.3g of PEFT's logits (the check "
           "cannot tell)", fx->name, logit_err);
    float *merged = xmalloc(table.total * sizeof(float));
    memcpy(merged, params, table.total * sizeof(float));
    lora_merge(&l, &table, merged, adapter);
    errors(&hf.cfg, merged, NULL, NULL, &ref, &logit_err, &loss_err);
    EXPECT(logit_err <= 1e-5 && loss_err <= 1e-6, "%s merged: logits %.3g, loss %.3g", fx->name,
           logit_err, loss_err);

    // Written by onepass: PEFT's names and shapes, the same values, the same config.
    char out[600];
    snprintf(out, sizeof out, "%s/%s", tmp, fx->name);
    EXPECT(make_dirs(out, err, sizeof err) == 0 &&
               peft_adapter_write(out, &l, adapter, base, NULL, 0, err, sizeof err) == 0,
           "%s", err);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", folder);
    char *theirs = key_set(path);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", out);
    char *ours = key_set(path);
    EXPECT(strcmp(theirs, ours) == 0, "%s: key sets differ:\n  peft %s\n  ours %s", fx->name,
           theirs, ours);
    free(theirs), free(ours);
    float *back = xmalloc(l.table.total * sizeof(float));
    LoraConfig lc2;
    EXPECT(peft_adapter_load(out, &l, back, err, sizeof err) == 0 &&
               memcmp(back, adapter, l.table.total * sizeof(float)) == 0,
           "%s: written values differ", fx->name);
    EXPECT(peft_config_read(out, &lc2, saved_base, sizeof saved_base, err, sizeof err) == 0 &&
               memcmp(&lc2, &lc, sizeof lc) == 0 && strcmp(saved_base, base) == 0,
           "%s: written config reads back otherwise: %s", fx->name, err);

    // An adapter of other targets misses tensors: refused naming one.
    LoraConfig other = lc;
    for (int t = 0; t < LORA_TARGETS; t++) other.target[t] = true;
    other.target[LORA_Q] = true;
    if (memcmp(other.target, lc.target, sizeof lc.target) != 0) {
        LoraLayout lo;
        lora_layout_build(&hf.cfg, &other, &lo);
        float *x = xmalloc(lo.table.total * sizeof(float));
        EXPECT(peft_adapter_load(folder, &lo, x, err, sizeof err) != 0 && strstr(err, "missing"),
               "%s: a missing tensor: %s", fx->name, err);
        free(x);
        lora_layout_free(&lo);
    } else {  // fewer targets: the file holds tensors the layout lacks
        other.target[LORA_K] = false;
        LoraLayout lo;
        lora_layout_build(&hf.cfg, &other, &lo);
        float *x = xmalloc(lo.table.total * sizeof(float));
        EXPECT(peft_adapter_load(folder, &lo, x, err, sizeof err) != 0 &&
                   strstr(err, "k_proj.lora_A.weight' is not an adapter"),
               "%s: an extra tensor: %s", fx->name, err);
        free(x);
        lora_layout_free(&lo);
    }

    hf_reference_free(&ref);
    free(params), free(adapter), free(merged), free(back);
    lora_layout_free(&l);
    param_table_free(&table);
}

// adapter_config.json of what onepass cannot run: refused naming the key.
static void refusals(const char *tmp) {
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"peft_type\": \"LOHA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}",
         "peft_type 'LOHA'"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": \"all-linear\"}",
         "target_modules: a list"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"qkv\"]}",
         "target_modules[0] 'qkv'"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"use_dora\": true}", "use_dora is set"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"rank_pattern\": {\"q_proj\": 8}}", "rank_pattern is set"},
        {"{\"peft_type\": \"LORA\", \"r\": 0, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}",
         "r: an integer in [1,"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"bias\": \"all\"}", "bias 'all'"},
    };
    char dir[600], path[700], err[1024], base[64];
    snprintf(dir, sizeof dir, "%s/bad", tmp);
    CHECK(make_dirs(dir, err, sizeof err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_text(path, cases[i].json);
        LoraConfig lc;
        const int rc = peft_config_read(dir, &lc, base, sizeof base, err, sizeof err);
        EXPECT(rc != 0 && strstr(err, cases[i].want) && strstr(err, "adapter_config.json"),
               "case %zu: want '%s', got rc %d '%s'", i, cases[i].want, rc, rc ? err : "");
    }
}

int main(void) {
    char tmp[] = "/tmp/test_peft_XXXXXX";
    CHECK(mkdtemp(tmp), "mkdtemp");
    for (size_t i = 0; i < sizeof FIXTURES / sizeof *FIXTURES; i++) run_fixture(&FIXTURES[i], tmp);
    refusals(tmp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return test_finish();
}
