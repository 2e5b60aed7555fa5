// safetensors files and model.safetensors.index.json. First byte even: the rest is a
// safetensors file, read and every F32/BF16/F16 tensor copied out. Odd: the rest is the
// index.json of a folder holding the shards of the committed Qwen3 fixture (linked), its
// weight files resolved and the fixture's parameter table loaded through it.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "model/hf_model.h"
#include "model/safetensors.h"

static char folder[64];
static const char *const SHARDS[] = {"config.json", "model-00001-of-00002.safetensors",
                                     "model-00002-of-00002.safetensors"};

static void remove_folder(void) {
    char path[160];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", folder, SHARDS[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", folder);
    unlink(path);
    rmdir(folder);
}

static void read_file(const uint8_t *data, size_t size) {
    const char *path = fuzz_temp_file(".safetensors", data, size);
    char err[1024];
    SafeTensorsFile f;
    if (safetensors_read(path, &f, err, sizeof err) == 0) {
        for (int i = 0; i < f.n_tensors; i++) {
            const SafeTensorInfo *t = &f.tensors[i];
            size_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
            if (numel > (1u << 20)) continue;
            float *dst = malloc((numel ? numel : 1) * sizeof(float));
            safetensors_copy_f32(&f, t->name, t->ndim, t->shape, dst, err, sizeof err);
            free(dst);
        }
    }
    safetensors_file_free(&f);
}

static void load_index(const uint8_t *data, size_t size) {
    static HfModelConfig hf;
    static ParamTable table;
    static float *params;
    char path[160], err[1024];
    if (!params) {
        snprintf(folder, sizeof folder, "/tmp/onepass_fuzz_index_%d", (int)getpid());
        if (mkdir(folder, 0700) != 0) abort();
        for (int i = 0; i < 3; i++) {
            char target[4200];
            snprintf(target, sizeof target, "tests/data/hf/qwen3_qknorm_sharded/%s", SHARDS[i]);
            snprintf(path, sizeof path, "%s/%s", folder, SHARDS[i]);
            if (symlink(fuzz_source_path(target), path) != 0) abort();
        }
        atexit(remove_folder);
        if (hf_config_read(folder, &hf, err, sizeof err) != 0) abort();
        param_table_build(&hf.cfg, &table);
        params = malloc(table.total * sizeof(float));
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", folder);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    HfWeightFiles files;
    if (hf_weight_files(folder, &files, err, sizeof err) == 0) hf_weight_files_free(&files);
    hf_weights_load(folder, &table, params, err, sizeof err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    if (size < 1) return 0;
    if (data[0] % 2 == 0) FUZZ_TRY(read_file(data + 1, size - 1));
    else FUZZ_TRY(load_index(data + 1, size - 1));
    return 0;
}
