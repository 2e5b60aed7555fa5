// Checkpoint round trip (weights, both AdamW moments, progress bit-identical), the HF
// config.json, and refusal of a checkpoint whose two files disagree on the step; the
// run record round trip, files from two saves, extra tensors and flipped bytes
// refused, the directory written as <dir>.tmp and renamed (also over an old one).
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "model/safetensors.h"
#include "test_util.h"
#include "trainer/checkpoint.h"

// Flips one byte at `from_end` bytes before the end of path.
static void flip_byte(const char *path, long from_end) {
    FILE *f = fopen(path, "r+b");
    CHECK(f, "open %s", path);
    fseek(f, -from_end, SEEK_END);
    int c = fgetc(f);
    fseek(f, -from_end, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
}

// Rewrites one __metadata__ value of a safetensors file (its tensors unchanged).
static void set_meta(const char *path, const char *key, const char *value) {
    FILE *f = fopen(path, "rb");
    CHECK(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *raw = xmalloc((size_t)len);
    CHECK(fread(raw, 1, (size_t)len, f) == (size_t)len, "read %s", path);
    fclose(f);
    uint64_t hlen;
    memcpy(&hlen, raw, 8);
    json_t *header = json_loadb((const char *)raw + 8, hlen, 0, NULL);
    CHECK(header, "header of %s", path);
    json_object_set_new(json_object_get(header, "__metadata__"), key, json_string(value));
    char *text = json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(header);
    uint64_t new_len = (strlen(text) + 7) / 8 * 8;
    f = fopen(path, "wb");
    fwrite(&new_len, 8, 1, f);
    fputs(text, f);
    for (size_t i = strlen(text); i < new_len; i++) fputc(' ', f);
    fwrite(raw + 8 + hlen, 1, (size_t)len - 8 - hlen, f);
    fclose(f);
    free(text);
    free(raw);
}

// Checksums cover the metadata as well as the tensors: an edited data position, step,
// token count or run record hash is refused, not resumed from.
static void test_metadata_checked(const char *dir, const ParamTable *table, const float *params,
                                  const AdamWState *opt, const TrainProgress *progress,
                                  const ModelConfig *cfg) {
    const struct { const char *file, *key, *value; } edits[] = {
        {"optimizer.safetensors", "data_cursor", "40"},
        {"optimizer.safetensors", "data_epoch", "2"},
        {"optimizer.safetensors", "tokens_seen", "1"},
        {"optimizer.safetensors", "elapsed_s", "0"},
        {"optimizer.safetensors", "run_record_hash", "0000000000000000"},
        {"model.safetensors", "run_record_hash", "0000000000000000"},
    };
    char ckpt[400], path[500], err[1024];
    float back_params[32];
    AdamWState back_opt;
    adamw_init(&back_opt, 32);
    TrainProgress back = {0};
    for (size_t i = 0; i < sizeof edits / sizeof edits[0] + 1; i++) {
        snprintf(ckpt, sizeof ckpt, "%s/meta-%zu", dir, i);
        EXPECT(checkpoint_save(ckpt, cfg, table, params, opt, progress, err, sizeof err) == 0,
               "save: %s", err);
        if (i == sizeof edits / sizeof edits[0]) {  // the step, in both files alike
            snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
            set_meta(path, "step", "16");
            snprintf(path, sizeof path, "%s/optimizer.safetensors", ckpt);
            set_meta(path, "step", "16");
        } else {
            snprintf(path, sizeof path, "%s/%s", ckpt, edits[i].file);
            set_meta(path, edits[i].key, edits[i].value);
        }
        EXPECT(checkpoint_load(ckpt, table, back_params, &back_opt, &back, err, sizeof err) != 0 &&
                   (strstr(err, "checksum mismatch") || strstr(err, "run record")),
               "edited %s refused: %s", i < sizeof edits / sizeof edits[0] ? edits[i].key : "step",
               err);
        free(back.run_record);
        back.run_record = NULL;
    }
    adamw_free(&back_opt);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    char dir[] = "/tmp/test_checkpoint_XXXXXX";
    if (!mkdtemp(dir)) fatal("mkdtemp failed");
    ParamTensor tensors[3] = {
        {.name = "model.embed_tokens.weight", .ndim = 2, .shape = {6, 4}, .offset = 0, .numel = 24, .is_embedding = true},
        {.name = "model.layers.0.input_layernorm.weight", .ndim = 1, .shape = {4}, .offset = 24, .numel = 4, .is_norm = true},
        {.name = "model.norm.weight", .ndim = 1, .shape = {4}, .offset = 28, .numel = 4, .is_norm = true},
    };
    ParamTable table = {.tensors = tensors, .n_tensors = 3, .total = 32};
    ModelConfig cfg = {.vocab_size = 6, .hidden_size = 4, .intermediate_size = 8,
                       .num_hidden_layers = 1, .num_attention_heads = 2, .num_key_value_heads = 1,
                       .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .tie_word_embeddings = true};
    float params[32], params_back[32];
    AdamWState opt, opt_back;
    adamw_init(&opt, 32);
    adamw_init(&opt_back, 32);
    for (int i = 0; i < 32; i++) {
        params[i] = test_rng_uniform(&rng);
        opt.m[i] = test_rng_uniform(&rng);
        opt.v[i] = fabsf(test_rng_uniform(&rng));
    }
    opt.step = 17;
    TrainProgress progress = {.step = 17, .data_epoch = 3, .data_cursor = 41,
                              .seed = 18446744073709551557ULL, .tokens_seen = 123456789012LL,
                              .trained_tokens_seen = 98765, .elapsed_s = 1.0 / 3.0,
                              .run_record = "{\"config\": {\"seed\": 1}}"};
    char ckpt[300], err[512];
    snprintf(ckpt, sizeof ckpt, "%s/run/checkpoint-000017", dir);
    EXPECT(checkpoint_save(ckpt, &cfg, &table, params, &opt, &progress, err, sizeof err) == 0, "save: %s", err);

    TrainProgress back = {0};
    EXPECT(checkpoint_load(ckpt, &table, params_back, &opt_back, &back, err, sizeof err) == 0, "load: %s", err);
    EXPECT(memcmp(params, params_back, sizeof params) == 0, "weights bit-identical");
    EXPECT(memcmp(opt.m, opt_back.m, 32 * sizeof(float)) == 0, "exp_avg bit-identical");
    EXPECT(memcmp(opt.v, opt_back.v, 32 * sizeof(float)) == 0, "exp_avg_sq bit-identical");
    EXPECT(opt_back.step == 17, "optimizer step %ld", opt_back.step);
    EXPECT(back.step == progress.step && back.data_epoch == progress.data_epoch &&
              back.data_cursor == progress.data_cursor && back.seed == progress.seed &&
              back.tokens_seen == progress.tokens_seen &&
              back.trained_tokens_seen == progress.trained_tokens_seen &&
              back.elapsed_s == progress.elapsed_s,
          "progress round trip");
    EXPECT(back.run_record && strcmp(back.run_record, progress.run_record) == 0, "run record: %s",
           back.run_record ? back.run_record : "(none)");
    free(back.run_record);
    back.run_record = NULL;
    char probe[400];
    snprintf(probe, sizeof probe, "%s.tmp", ckpt);
    EXPECT(access(probe, F_OK) != 0, "no %s left", probe);

    // Saving again over the directory (a stale <dir>.tmp of a killed save in the way)
    // replaces it whole.
    EXPECT(mkdir(probe, 0777) == 0, "stale tmp dir");
    progress.elapsed_s = 2.0;
    EXPECT(checkpoint_save(ckpt, &cfg, &table, params, &opt, &progress, err, sizeof err) == 0, "save over: %s", err);
    EXPECT(checkpoint_load(ckpt, &table, params_back, &opt_back, &back, err, sizeof err) == 0 &&
              back.elapsed_s == 2.0, "the new save is what loads: %s", err);
    free(back.run_record);
    back.run_record = NULL;
    EXPECT(access(probe, F_OK) != 0, "no %s left after a save over", probe);
    snprintf(probe, sizeof probe, "%s.old", ckpt);
    EXPECT(access(probe, F_OK) != 0, "no %s left", probe);

    // The model file alone is a plain HF-named safetensors file.
    char path[400];
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    SafeTensorsFile f;
    EXPECT(safetensors_read(path, &f, err, sizeof err) == 0 && f.n_tensors == 3 &&
              safetensors_find(&f, "model.norm.weight") != NULL,
          "model.safetensors holds the HF names: %s", err);
    safetensors_file_free(&f);
    snprintf(path, sizeof path, "%s/config.json", ckpt);
    json_t *hf = json_load_file(path, 0, NULL);
    EXPECT(hf && json_integer_value(json_object_get(hf, "hidden_size")) == 4 &&
              json_integer_value(json_object_get(hf, "num_key_value_heads")) == 1 &&
              json_is_true(json_object_get(hf, "tie_word_embeddings")),
          "HF config.json");
    json_decref(hf);

    // A model file from another step (a checkpoint written halfway) is refused.
    progress.step = 18;
    char other[300];
    snprintf(other, sizeof other, "%s/other", dir);
    EXPECT(checkpoint_save(other, &cfg, &table, params, &opt, &progress, err, sizeof err) == 0, "save 2: %s", err);
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "cp %s/model.safetensors %s/model.safetensors", other, ckpt);
    EXPECT(system(cmd) == 0, "copy");
    EXPECT(checkpoint_load(ckpt, &table, params_back, &opt_back, &back, err, sizeof err) != 0 &&
              strstr(err, "incomplete checkpoint"),
          "mismatched steps refused: %s", err);

    // Same step, another save (run A's moments beside run B's weights): refused by the
    // per-save id in both files.
    char again[300];
    snprintf(again, sizeof again, "%s/again", dir);
    progress.step = 18;
    EXPECT(checkpoint_save(again, &cfg, &table, params, &opt, &progress, err, sizeof err) == 0, "save 3: %s", err);
    snprintf(cmd, sizeof cmd, "cp %s/model.safetensors %s/model.safetensors", other, again);
    EXPECT(system(cmd) == 0, "copy");
    EXPECT(checkpoint_load(again, &table, params_back, &opt_back, &back, err, sizeof err) != 0 &&
              strstr(err, "different saves"),
          "files of two saves refused: %s", err);

    // A flipped byte in a tensor is caught by the checksum, in either file.
    const struct { const char *file; long from_end; } flips[] = {
        {"model.safetensors", 5}, {"optimizer.safetensors", 70}};
    for (int i = 0; i < 2; i++) {
        EXPECT(checkpoint_save(again, &cfg, &table, params, &opt, &progress, err, sizeof err) == 0,
               "save: %s", err);
        snprintf(path, sizeof path, "%s/%s", again, flips[i].file);
        flip_byte(path, flips[i].from_end);
        EXPECT(checkpoint_load(again, &table, params_back, &opt_back, &back, err, sizeof err) != 0 &&
                  strstr(err, flips[i].file) && strstr(err, "checksum"),
              "corrupt %s refused: %s", flips[i].file, err);
    }

    // A checkpoint with more tensors than the model (4 layers resumed as 2): refused,
    // naming the extra tensor.
    ParamTable smaller = {.tensors = tensors, .n_tensors = 2, .total = 28};
    EXPECT(checkpoint_load(other, &smaller, params_back, &opt_back, &back, err, sizeof err) != 0 &&
              strstr(err, "model.norm.weight") && strstr(err, "not in the model"),
          "extra tensor refused: %s", err);

    // A table with a tensor the checkpoint lacks: the error names it.
    ParamTensor more[4];
    memcpy(more, tensors, sizeof tensors);
    more[3] = (ParamTensor){.name = "lm_head.weight", .ndim = 2, .shape = {6, 4}, .offset = 32, .numel = 24};
    ParamTable bigger = {.tensors = more, .n_tensors = 4, .total = 56};
    float big_params[56];
    AdamWState big_opt;
    adamw_init(&big_opt, 56);
    EXPECT(checkpoint_load(other, &bigger, big_params, &big_opt, &back, err, sizeof err) != 0 &&
              strstr(err, "lm_head.weight"),
          "missing tensor named: %s", err);
    adamw_free(&big_opt);

    // A checkpoint whose index names weights outside its folder ("../") is refused by
    // the same resolver as a model folder's.
    char outside[300];
    snprintf(outside, sizeof outside, "%s/outside", dir);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && cp %s/optimizer.safetensors %s/config.json %s/ && printf "
             "'{\"weight_map\": {\"model.embed_tokens.weight\": \"../other/model.safetensors\", "
             "\"model.layers.0.input_layernorm.weight\": \"../other/model.safetensors\", "
             "\"model.norm.weight\": \"../other/model.safetensors\"}}' > "
             "%s/model.safetensors.index.json",
             outside, other, other, outside, outside);
    EXPECT(system(cmd) == 0, "%s", cmd);
    EXPECT(checkpoint_load(outside, &table, params_back, &opt_back, &back, err, sizeof err) != 0 &&
               strstr(err, "'../other/model.safetensors' is not a file name"),
           "a checkpoint's index reaching outside its folder refused: %s", err);
    free(back.run_record);
    back.run_record = NULL;

    progress.step = 17;
    test_metadata_checked(dir, &table, params, &opt, &progress, &cfg);

    // The run record's reader refuses a header length over the format's cap by its 8
    // bytes (a sparse optimizer.safetensors claims 256 MiB).
    char huge[300];
    snprintf(huge, sizeof huge, "%s/huge", dir);
    EXPECT(mkdir(huge, 0777) == 0, "mkdir huge");
    snprintf(path, sizeof path, "%s/optimizer.safetensors", huge);
    const uint64_t claimed = (uint64_t)1 << 28;
    FILE *hf_file = fopen(path, "wb");
    fwrite(&claimed, 8, 1, hf_file);
    fclose(hf_file);
    EXPECT(truncate(path, (off_t)(8 + claimed + 64)) == 0, "sparse file");
    char *record = NULL;
    EXPECT(checkpoint_read_run_record(huge, &record, err, sizeof err) != 0 &&
               strstr(err, "optimizer.safetensors") && strstr(err, "100000000"),
           "run record header over the cap refused: %s", err);
    free(record);

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    adamw_free(&opt);
    adamw_free(&opt_back);
    return test_finish();
}
