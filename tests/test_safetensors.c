// safetensors: round trip, the byte format checked by an independent parse of the
// raw file (length prefix, JSON header, offsets, little-endian F32 data), and errors.
#include <jansson.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "model/safetensors.h"
#include "test_util.h"

static char dir[] = "/tmp/test_safetensors_XXXXXX";

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = xmalloc(*len);
    size_t got = fread(buf, 1, *len, f);
    fclose(f);
    return got == *len ? buf : NULL;
}

static void write_all(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, len, f);
    fclose(f);
}

// Writes a file with a hand-written header and `data_len` bytes of data.
static void write_raw(const char *path, const char *header, size_t data_len) {
    uint64_t n = strlen(header);
    unsigned char *buf = xcalloc(8 + n + data_len, 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, header, n);
    write_all(path, buf, 8 + n + data_len);
    free(buf);
}

static void test_round_trip_and_format(TestRng *rng) {
    enum { NT = 3 };
    int64_t shapes[NT][3] = {{5, 0, 0}, {3, 4, 0}, {2, 3, 2}};
    int ndims[NT] = {1, 2, 3};
    const char *names[NT] = {"model.norm.weight", "model.layers.0.mlp.up_proj.weight", "x.y"};
    float *data[NT];
    SafeTensorOut out[NT];
    for (int t = 0; t < NT; t++) {
        size_t n = 1;
        for (int d = 0; d < ndims[t]; d++) n *= (size_t)shapes[t][d];
        data[t] = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) data[t][i] = test_rng_uniform(rng) * 100.0f;
        out[t] = (SafeTensorOut){.name = names[t], .ndim = ndims[t], .data = data[t]};
        memcpy(out[t].shape, shapes[t], sizeof shapes[t]);
    }
    SafeTensorMeta meta[] = {{"format", "pt"}, {"step", "42"}};
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    EXPECT(safetensors_write(path, out, NT, meta, 2, err, sizeof err) == 0, "write: %s", err);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    EXPECT(access(tmp, F_OK) != 0, "no temp file left behind");

    // Independent parse of the raw bytes.
    size_t len = 0;
    unsigned char *raw = read_all(path, &len);
    EXPECT(raw != NULL && len > 8, "file readable");
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)raw[i] << (8 * i);
    EXPECT(hlen % 8 == 0, "header padded to 8 bytes: %llu", (unsigned long long)hlen);
    json_t *header = json_loadb((const char *)raw + 8, hlen, 0, NULL);
    EXPECT(json_is_object(header), "header is JSON");
    json_t *m = json_object_get(header, "__metadata__");
    EXPECT(json_is_string(json_object_get(m, "step")) &&
              strcmp(json_string_value(json_object_get(m, "step")), "42") == 0,
          "metadata step");
    size_t total = 0;
    for (int t = 0; t < NT; t++) {
        json_t *e = json_object_get(header, names[t]);
        EXPECT(e && strcmp(json_string_value(json_object_get(e, "dtype")), "F32") == 0, "%s dtype", names[t]);
        json_t *shape = json_object_get(e, "shape");
        bool shape_ok = json_array_size(shape) == (size_t)ndims[t];
        for (int d = 0; shape_ok && d < ndims[t]; d++)
            shape_ok = json_integer_value(json_array_get(shape, (size_t)d)) == shapes[t][d];
        EXPECT(shape_ok, "%s shape", names[t]);
        json_t *offs = json_object_get(e, "data_offsets");
        size_t begin = (size_t)json_integer_value(json_array_get(offs, 0));
        size_t end = (size_t)json_integer_value(json_array_get(offs, 1));
        size_t n = (end - begin) / 4;
        total += end - begin;
        bool same = end <= len - 8 - hlen;
        for (size_t i = 0; same && i < n; i++) {
            const unsigned char *b = raw + 8 + hlen + begin + 4 * i;
            uint32_t bits = b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24;
            float f;
            memcpy(&f, &bits, 4);
            same = f == data[t][i];
        }
        EXPECT(same, "%s: raw little-endian data equals the tensor", names[t]);
    }
    EXPECT(total == len - 8 - hlen, "data section holds exactly the tensors (%zu vs %zu)", total,
          (size_t)(len - 8 - hlen));
    json_decref(header);
    free(raw);

    // Read back through the library.
    SafeTensorsFile f;
    EXPECT(safetensors_read(path, &f, err, sizeof err) == 0, "read: %s", err);
    EXPECT(f.n_tensors == NT, "tensor count %d", f.n_tensors);
    EXPECT(safetensors_meta(&f, "format") && strcmp(safetensors_meta(&f, "format"), "pt") == 0, "format meta");
    EXPECT(safetensors_meta(&f, "absent") == NULL, "absent meta");
    for (int t = 0; t < NT; t++) {
        size_t n = 1;
        for (int d = 0; d < ndims[t]; d++) n *= (size_t)shapes[t][d];
        float *back = xmalloc(n * sizeof(float));
        EXPECT(safetensors_copy_f32(&f, names[t], ndims[t], shapes[t], back, err, sizeof err) == 0, "copy: %s", err);
        EXPECT(memcmp(back, data[t], n * sizeof(float)) == 0, "%s bit-identical", names[t]);
        free(back);
    }
    float dummy[64];
    int64_t wrong[2] = {4, 3};
    EXPECT(safetensors_copy_f32(&f, names[1], 2, wrong, dummy, err, sizeof err) != 0 &&
              strstr(err, names[1]) && strstr(err, "shape"),
          "wrong shape names the tensor: %s", err);
    EXPECT(safetensors_copy_f32(&f, "nope", 1, wrong, dummy, err, sizeof err) != 0 && strstr(err, "nope"),
          "missing tensor named: %s", err);
    safetensors_file_free(&f);
    for (int t = 0; t < NT; t++) free(data[t]);
}

static void test_table_prefix(TestRng *rng) {
    ParamTensor tensors[2] = {
        {.name = "a.weight", .ndim = 2, .shape = {2, 3}, .offset = 0, .numel = 6},
        {.name = "b.weight", .ndim = 1, .shape = {4}, .offset = 6, .numel = 4},
    };
    ParamTable table = {.tensors = tensors, .n_tensors = 2, .total = 10};
    float buf[10], back[10] = {0};
    for (int i = 0; i < 10; i++) buf[i] = test_rng_uniform(rng);
    SafeTensorOut entries[2];
    safetensors_table_entries(&table, "exp_avg.", buf, entries);
    EXPECT(strcmp(entries[1].name, "exp_avg.b.weight") == 0, "prefixed name %s", entries[1].name);
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    EXPECT(safetensors_write(path, entries, 2, NULL, 0, err, sizeof err) == 0, "write: %s", err);
    safetensors_entries_free(entries, 2);
    SafeTensorsFile f;
    EXPECT(safetensors_read(path, &f, err, sizeof err) == 0, "read: %s", err);
    EXPECT(safetensors_load_table(&f, &table, "exp_avg.", back, err, sizeof err) == 0, "load: %s", err);
    EXPECT(memcmp(buf, back, sizeof buf) == 0, "table round trip");
    EXPECT(safetensors_load_table(&f, &table, "", back, err, sizeof err) != 0 && strstr(err, "a.weight"),
          "unprefixed names are absent: %s", err);
    safetensors_file_free(&f);
}

static void test_malformed(void) {
    char path[256], err[512];
    SafeTensorsFile f;
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    write_all(path, "abc", 3);
    EXPECT(safetensors_read(path, &f, err, sizeof err) != 0 && strstr(err, "header length"), "short file: %s", err);
    safetensors_file_free(&f);
    write_raw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8);
    EXPECT(safetensors_read(path, &f, err, sizeof err) != 0 && strstr(err, "'w'"), "offsets past the end: %s", err);
    safetensors_file_free(&f);
    write_raw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}", 16);
    EXPECT(safetensors_read(path, &f, err, sizeof err) != 0 && strstr(err, "do not match"), "size vs shape: %s", err);
    safetensors_file_free(&f);
    write_raw(path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                    " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12);
    EXPECT(safetensors_read(path, &f, err, sizeof err) != 0 && strstr(err, "overlap"), "overlap: %s", err);
    safetensors_file_free(&f);
    write_raw(path, "{\"w\": {\"dtype\": \"I32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
    EXPECT(safetensors_read(path, &f, err, sizeof err) == 0, "I32 file reads: %s", err);
    int64_t shape[1] = {2};
    float dst[2];
    EXPECT(safetensors_copy_f32(&f, "w", 1, shape, dst, err, sizeof err) != 0 &&
               strstr(err, "'w' has dtype I32, expected F32, BF16 or F16"),
          "I32 refused: %s", err);
    safetensors_file_free(&f);
    // Shapes whose byte size wraps size_t (2^62 floats; 2^32 x 2^32) are refused, not
    // taken as 0 bytes.
    write_raw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 0]}}", 0);
    EXPECT(safetensors_read(path, &f, err, sizeof err) != 0 && strstr(err, "'w'") && strstr(err, "too large"),
           "wrapping byte size refused: %s", err);
    safetensors_file_free(&f);
    write_raw(path, "{\"w\": {\"dtype\": \"BF16\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}", 0);
    EXPECT(safetensors_read(path, &f, err, sizeof err) != 0 && strstr(err, "'w'") && strstr(err, "too large"),
           "wrapping element count refused: %s", err);
    safetensors_file_free(&f);
    write_raw(path, "[1, 2]", 0);
    EXPECT(safetensors_read(path, &f, err, sizeof err) != 0 && strstr(err, "not a JSON object"), "array header: %s", err);
    safetensors_file_free(&f);
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    EXPECT(safetensors_read(path, &f, err, sizeof err) != 0 && strstr(err, "missing.safetensors"), "missing file: %s", err);
    safetensors_file_free(&f);
}

// Raw 16-bit tensors of known bit patterns read back as the exact floats they denote.
static void test_half_dtypes(void) {
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/half.safetensors", dir);
    // bf16: 1.0, -2.5, 2^-133 (subnormal in float), +inf; f16: 1.0, -2.5, 2^-24 (the
    // smallest subnormal), 65504 (the largest), -0.0, +inf
    const uint16_t bf16[4] = {0x3f80, 0xc020, 0x0001, 0x7f80};
    const uint16_t f16[6] = {0x3c00, 0xc100, 0x0001, 0x7bff, 0x8000, 0x7c00};
    const float bf16_want[4] = {1.0f, -2.5f, ldexpf(1.0f, -133), INFINITY};
    const float f16_want[6] = {1.0f, -2.5f, ldexpf(1.0f, -24), 65504.0f, -0.0f, INFINITY};
    const char *header = "{\"b\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [0, 8]},"
                         " \"h\": {\"dtype\": \"F16\", \"shape\": [2, 3], \"data_offsets\": [8, 20]}}";
    const size_t n = strlen(header);
    unsigned char *buf = xcalloc(8 + n + 20, 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    memcpy(buf + 8 + n, bf16, 8);
    memcpy(buf + 8 + n + 8, f16, 12);
    write_all(path, buf, 8 + n + 20);
    free(buf);
    SafeTensorsFile f;
    EXPECT(safetensors_read(path, &f, err, sizeof err) == 0, "half file reads: %s", err);
    float got_b[4], got_h[6];
    const int64_t shape_b[1] = {4}, shape_h[2] = {2, 3};
    EXPECT(safetensors_copy_f32(&f, "b", 1, shape_b, got_b, err, sizeof err) == 0, "bf16: %s", err);
    EXPECT(safetensors_copy_f32(&f, "h", 2, shape_h, got_h, err, sizeof err) == 0, "f16: %s", err);
    EXPECT(memcmp(got_b, bf16_want, sizeof got_b) == 0, "bf16 values exact");
    EXPECT(memcmp(got_h, f16_want, sizeof got_h) == 0, "f16 values exact (and -0.0)");
    safetensors_file_free(&f);
}

// A header length over the format's 100 MB cap is refused from the 8 bytes that claim
// it, before anything of that size is allocated or read: a sparse file claims 256 MiB.
static void test_header_cap(void) {
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/huge_header.safetensors", dir);
    const uint64_t claimed = (uint64_t)1 << 28;
    FILE *f = fopen(path, "wb");
    fwrite(&claimed, 8, 1, f);
    fclose(f);
    EXPECT(truncate(path, (off_t)(8 + claimed + 64)) == 0, "sparse file");
    SafeTensorsFile st;
    EXPECT(safetensors_read(path, &st, err, sizeof err) != 0 && strstr(err, "huge_header") &&
               strstr(err, "268435456") && strstr(err, "100000000"),
           "header over the cap refused by its length: %s", err);
    safetensors_file_free(&st);
    unlink(path);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    if (!mkdtemp(dir)) fatal("mkdtemp failed");
    test_round_trip_and_format(&rng);
    test_table_prefix(&rng);
    test_malformed();
    test_half_dtypes();
    test_header_cap();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_finish();
}
