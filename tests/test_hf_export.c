// Hugging Face model folders out: init_from -> export equals the input weights bit for
// bit (bf16 -> fp32 -> bf16, f16, f32); checkpoint -> export -> export is bit-identical;
// sharding above the size limit; bf16/f16 rounding; a bf16 checkpoint resumes the exact
// fp32 master weights; refusals with their messages.
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "common/check.h"
#include "model/hf_export.h"
#include "model/hf_model.h"
#include "model/safetensors.h"
#include "tests/test_hf_util.h"
#include "tests/test_util.h"
#include "trainer/checkpoint.h"

static char dir[] = "/tmp/test_hf_export_XXXXXX";


// The file of folder that holds tensor `name`: model.safetensors, else the shard the
// index names.
static void tensor_file(const char *folder, const char *name, char *path, size_t len) {
    snprintf(path, len, "%s/model.safetensors.index.json", folder);
    json_t *index = json_load_file(path, 0, NULL);
    const json_t *file = json_object_get(json_object_get(index, "weight_map"), name);
    if (json_is_string(file)) snprintf(path, len, "%s/%s", folder, json_string_value(file));
    else snprintf(path, len, "%s/model.safetensors", folder);
    json_decref(index);
}

// Whether every tensor of folder a has the same dtype, shape and bytes in folder b.
static bool same_tensors(const char *a, const char *b, const ParamTable *table) {
    bool same = true;
    for (int i = 0; i < table->n_tensors && same; i++) {
        const char *folders[2] = {a, b};
        SafeTensorsFile files[2];
        const SafeTensorInfo *info[2];
        for (int k = 0; k < 2; k++) {
            char path[1024], err[512];
            tensor_file(folders[k], table->tensors[i].name, path, sizeof path);
            CHECK(safetensors_read(path, &files[k], err, sizeof err) == 0, "%s", err);
            info[k] = safetensors_find(&files[k], table->tensors[i].name);
        }
        same = info[0] && info[1] && strcmp(info[0]->dtype, info[1]->dtype) == 0 &&
               info[0]->ndim == info[1]->ndim &&
               memcmp(info[0]->shape, info[1]->shape, sizeof info[0]->shape) == 0 &&
               info[0]->end - info[0]->begin == info[1]->end - info[1]->begin &&
               memcmp(files[0].data + info[0]->begin, files[1].data + info[1]->begin,
                      info[0]->end - info[0]->begin) == 0;
        if (!same) fprintf(stderr, "tensor %s differs\n", table->tensors[i].name);
        safetensors_file_free(&files[0]);
        safetensors_file_free(&files[1]);
    }
    return same;
}

static bool same_file(const char *a, const char *b) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

// init_from -> (no step) -> export in the source dtype: the stored values, bit for bit.
static void test_round_trip_fixtures(void) {
    const struct { const char *name; SaveDtype dtype; } cases[] = {
        {"llama3_scaling", SAVE_F32}, {"llama_linear_f16", SAVE_F16},
        {"qwen2_bias_bf16", SAVE_BF16}, {"qwen3_qknorm_sharded", SAVE_BF16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char src[256], out[512], err[1024];
        snprintf(src, sizeof src, "tests/data/hf/%s", cases[i].name);
        snprintf(out, sizeof out, "%s/%s", dir, cases[i].name);
        HfModelConfig hf;
        ParamTable table;
        float *params = load_hf_folder(src, &hf, &table);
        HfExport e = {.hf = hf, .dtype = cases[i].dtype, .generation_eos_token_id = -1};
        EXPECT(hf_export_write(out, &table, params, &e, err, sizeof err) == 0, "%s: %s",
               cases[i].name, err);
        EXPECT(same_tensors(src, out, &table), "%s: exported tensors equal the input's",
               cases[i].name);
        HfModelConfig back;
        hf.cfg.head_dim = model_dims(&hf.cfg).head_dim;  // written explicitly
        EXPECT(hf_config_read(out, &back, err, sizeof err) == 0 &&
                   memcmp(&back.cfg, &hf.cfg, sizeof hf.cfg) == 0 &&
                   back.bos_token_id == hf.bos_token_id && back.n_eos == hf.n_eos &&
                   strcmp(back.dtype, save_dtype_torch_name(cases[i].dtype)) == 0,
               "%s: config.json reads back the same model: %s", cases[i].name, err);
        free(params);
        param_table_free(&table);
    }
}

// A bf16 checkpoint (master weights in the optimizer file) -> export -> export.
static void test_checkpoint_export(void) {
    char ckpt[256], a[256], b[256], c[256], err[1024];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint", dir);
    snprintf(a, sizeof a, "%s/export_a", dir);
    snprintf(b, sizeof b, "%s/export_b", dir);
    snprintf(c, sizeof c, "%s/export_f32", dir);
    HfModelConfig hf;
    ParamTable table;
    float *params = load_hf_folder("tests/data/hf/qwen3_qknorm_sharded", &hf, &table);
    for (size_t i = 0; i < table.total; i++) params[i] *= 1.0f + 1e-3f * (float)(i % 7);  // "trained"
    AdamWState opt;
    adamw_init(&opt, table.total);
    for (size_t i = 0; i < table.total; i++) opt.m[i] = 0.5f * params[i], opt.v[i] = (float)i;
    const TrainProgress progress = {.step = 3, .seed = 9};
    HfExport e = {.hf = hf, .dtype = SAVE_BF16, .generation_eos_token_id = 7};
    EXPECT(checkpoint_save_hf(ckpt, &table, params, &opt, &progress, &e, NULL, NULL, err, sizeof err) == 0,
           "bf16 checkpoint: %s", err);

    // Resume: the fp32 master weights, not their bf16 rounding.
    float *resumed = xmalloc(table.total * sizeof(float));
    AdamWState opt2;
    adamw_init(&opt2, table.total);
    TrainProgress p2;
    EXPECT(checkpoint_load(ckpt, &table, resumed, &opt2, &p2, err, sizeof err) == 0 &&
               memcmp(resumed, params, table.total * sizeof(float)) == 0 && p2.step == 3,
           "bf16 checkpoint resumes the exact fp32 weights: %s", err);
    float *model_bf16 = xmalloc(table.total * sizeof(float));
    EXPECT(hf_weights_load(ckpt, &table, model_bf16, err, sizeof err) == 0 &&
               memcmp(model_bf16, params, table.total * sizeof(float)) != 0,
           "its model.safetensors holds bf16 values: %s", err);
    char path[512];
    snprintf(path, sizeof path, "%s/generation_config.json", ckpt);
    FILE *f = fopen(path, "r");
    char text[512] = "";
    if (f) text[fread(text, 1, sizeof text - 1, f)] = '\0', fclose(f);
    EXPECT(strstr(text, "\"eos_token_id\": 7"), "generation_config eos is the end of turn: %s", text);

    EXPECT(hf_export_checkpoint(ckpt, a, NULL, err, sizeof err) == 0, "export a: %s", err);
    EXPECT(hf_export_checkpoint(a, b, NULL, err, sizeof err) == 0, "export b: %s", err);
    const char *files[] = {"config.json", "model.safetensors", "generation_config.json"};
    for (size_t i = 0; i < 3; i++) {
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        EXPECT(same_file(pa, pb), "export -> reload -> export: %s bit-identical", files[i]);
    }
    snprintf(path, sizeof path, "%s/optimizer.safetensors", a);
    EXPECT(access(path, F_OK) != 0, "an export has no optimizer state");

    // f32 export of the checkpoint: the master weights themselves.
    const SaveDtype f32 = SAVE_F32;
    EXPECT(hf_export_checkpoint(ckpt, c, &f32, err, sizeof err) == 0, "export f32: %s", err);
    float *exported = xmalloc(table.total * sizeof(float));
    EXPECT(hf_weights_load(c, &table, exported, err, sizeof err) == 0 &&
               memcmp(exported, params, table.total * sizeof(float)) == 0,
           "f32 export equals the fp32 master weights: %s", err);

    // Shards above the limit: an index and several files that load back the same.
    char sharded[256];
    snprintf(sharded, sizeof sharded, "%s/sharded", dir);
    HfExport small = {.hf = hf, .dtype = SAVE_F32, .shard_bytes = 40000, .generation_eos_token_id = -1};
    EXPECT(hf_export_write(sharded, &table, params, &small, err, sizeof err) == 0, "sharded: %s", err);
    snprintf(path, sizeof path, "%s/model-00005-of-00005.safetensors", sharded);
    EXPECT(access(path, F_OK) == 0, "124 kB in 5 shards of <= 40 kB (%s)", path);
    snprintf(path, sizeof path, "%s/model.safetensors", sharded);
    EXPECT(access(path, F_OK) != 0, "no model.safetensors beside the shards");
    EXPECT(hf_weights_load(sharded, &table, exported, err, sizeof err) == 0 &&
               memcmp(exported, params, table.total * sizeof(float)) == 0,
           "sharded export loads back the same: %s", err);
    // Re-exported unsharded into the same folder: the old index and shards go.
    EXPECT(hf_export_write(sharded, &table, params, &e, err, sizeof err) == 0 &&
               hf_weights_load(sharded, &table, exported, err, sizeof err) == 0,
           "unsharded over sharded: %s", err);
    snprintf(path, sizeof path, "%s/model-00001-of-00005.safetensors", sharded);
    EXPECT(access(path, F_OK) != 0, "stale shards removed");

    adamw_free(&opt), adamw_free(&opt2);
    free(params), free(resumed), free(model_bf16), free(exported);
    param_table_free(&table);
}

static void test_rounding(void) {
    // bf16: 1 + 2^-8 is a tie -> 1 (even); 1 + 3*2^-8 -> 1 + 2^-6; NaN stays NaN.
    EXPECT(float_to_bf16(1.00390625f) == 0x3f80 && float_to_bf16(1.01171875f) == 0x3f82 &&
               (float_to_bf16(NAN) & 0x7fc0) == 0x7fc0,
           "bf16 rounding to nearest even");
    // f16: 65504 exact, 65520 -> inf, 2^-24 the smallest subnormal, 2^-25 a tie -> 0,
    // 1 + 2^-11 a tie -> 1.
    EXPECT(float_to_f16(65504.0f) == 0x7bff && float_to_f16(65520.0f) == 0x7c00 &&
               float_to_f16(ldexpf(1.0f, -24)) == 0x0001 && float_to_f16(ldexpf(1.0f, -25)) == 0 &&
               float_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00 && float_to_f16(-2.5f) == 0xc100,
           "f16 rounding, overflow and subnormals");
    int exact = 1;
    for (uint32_t h = 0; h < 0x10000; h++) {
        const float f = f16_to_float((uint16_t)h);
        if (isnan(f)) continue;
        exact &= float_to_f16(f) == h;
        exact &= float_to_bf16(bf16_to_float((uint16_t)h)) == h || isnan(bf16_to_float((uint16_t)h));
    }
    EXPECT(exact, "every f16 and bf16 value survives the round trip through float");
}

static void test_refusals(void) {
    char err[512];
    SaveDtype d;
    EXPECT(save_dtype_parse("fp8", &d, err, sizeof err) != 0 &&
               strstr(err, "dtype 'fp8' is not one of bf16, f16, f32"),
           "bad dtype: %s", err);
    char out[256];
    snprintf(out, sizeof out, "%s/none", dir);
    EXPECT(hf_export_checkpoint("tests/data", out, NULL, err, sizeof err) != 0 &&
               strstr(err, "tests/data/config.json: cannot open"),
           "export of a folder that is no model: %s", err);
}

int main(void) {
    test_rng_from_env();
    if (!mkdtemp(dir)) fatal("mkdtemp failed");
    test_round_trip_fixtures();
    test_checkpoint_export();
    test_rounding();
    test_refusals();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "%s %s", getenv("KEEP") ? "ls -R" : "rm -rf", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_finish();
}
