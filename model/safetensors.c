#define _POSIX_C_SOURCE 200809L
#include "model/safetensors.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/output_file.h"

// The data section is written and read as raw host floats: this file assumes a
// little-endian host (x86-64, aarch64), as the format is little-endian.

static size_t numel_of(int ndim, const int64_t *shape) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
    return n;
}

int safetensors_write(const char *path, const SafeTensorOut *tensors, int n_tensors,
                      const SafeTensorMeta *meta, int n_meta, char *err, size_t err_len) {
    json_t *header = json_object();
    if (n_meta > 0) {
        json_t *m = json_object();
        for (int i = 0; i < n_meta; i++) json_object_set_new(m, meta[i].key, json_string(meta[i].value));
        json_object_set_new(header, "__metadata__", m);
    }
    size_t offset = 0;
    for (int i = 0; i < n_tensors; i++) {
        const SafeTensorOut *t = &tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        const bool half = t->dtype && strcmp(t->dtype, "F32") != 0;
        size_t bytes = numel_of(t->ndim, t->shape) * (half ? 2 : sizeof(float));
        json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", half ? t->dtype : "F32", "shape", shape,
                                  "data_offsets", (json_int_t)offset, (json_int_t)(offset + bytes));
        if (json_object_get(header, t->name)) {
            json_decref(header);
            return fail_at(err, err_len, path, 0, "duplicate tensor name '%s'", t->name);
        }
        json_object_set_new(header, t->name, entry);
        offset += bytes;
    }
    char *text = json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(header);
    size_t text_len = strlen(text);
    size_t padded = (text_len + 7) / 8 * 8;  // data section starts 8-byte aligned
    uint64_t header_len = padded;

    OutputFile out;
    if (output_open(&out, path, err, err_len) != 0) {
        free(text);
        return -1;
    }
    FILE *f = out.f;
    bool ok = fwrite(&header_len, 8, 1, f) == 1 && fwrite(text, 1, text_len, f) == text_len;
    for (size_t i = text_len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    free(text);
    for (int i = 0; ok && i < n_tensors; i++) {
        size_t n = numel_of(tensors[i].ndim, tensors[i].shape);
        const bool half = tensors[i].dtype && strcmp(tensors[i].dtype, "F32") != 0;
        ok = half ? fwrite(tensors[i].data16, 2, n, f) == n
                  : fwrite(tensors[i].data, sizeof(float), n, f) == n;
    }
    if (!ok) {
        const int saved_errno = errno;
        output_discard(&out);
        return fail_at(err, err_len, path, 0, "write failed: %s", strerror(saved_errno));
    }
    return output_commit(&out, err, err_len);
}

float bf16_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// IEEE binary16: sign, 5-bit exponent (bias 15), 10-bit mantissa; subnormals, inf, NaN.
float f16_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {
        const float v = (float)man * (1.0f / 16777216.0f);  // man * 2^-24, exact
        memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);  // quiet NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

uint16_t float_to_f16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00u;     // NaN
    if (abs >= 0x477ff000u) return sign | 0x7c00u;    // >= 65520 rounds to infinity
    if (abs < 0x38800000u) {                          // below 2^-14: subnormal or zero
        // value * 2^24 rounded to an integer, nearest even (exact in float arithmetic).
        float a;
        memcpy(&a, &abs, 4);
        return sign | (uint16_t)nearbyintf(a * 16777216.0f);
    }
    const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13);
}

static size_t dtype_size(const char *dtype) {
    static const struct { const char *name; size_t size; } sizes[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
        {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(sizes[i].name, dtype) == 0) return sizes[i].size;
    return 0;
}

static int compare_begin(const void *a, const void *b) {
    const SafeTensorInfo *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

// Parses one header entry into info; returns 0 or -1 with a message.
static int parse_entry(const char *path, const char *name, json_t *entry, size_t data_len,
                       SafeTensorInfo *info, char *err, size_t err_len) {
    json_t *dtype = json_object_get(entry, "dtype");
    json_t *shape = json_object_get(entry, "shape");
    json_t *offsets = json_object_get(entry, "data_offsets");
    if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offsets) ||
        json_array_size(offsets) != 2)
        return fail_at(err, err_len, path, 0,
                       "tensor '%s': needs dtype, shape and data_offsets [begin, end]", name);
    size_t elem = dtype_size(json_string_value(dtype));
    if (!elem)
        return fail_at(err, err_len, path, 0, "tensor '%s': unknown dtype '%s'", name,
                       json_string_value(dtype));
    if (json_array_size(shape) > SAFETENSORS_MAX_DIMS)
        return fail_at(err, err_len, path, 0, "tensor '%s': more than %d dimensions", name,
                       SAFETENSORS_MAX_DIMS);
    info->name = strdup(name);
    snprintf(info->dtype, sizeof info->dtype, "%s", json_string_value(dtype));
    info->ndim = (int)json_array_size(shape);
    for (int d = 0; d < info->ndim; d++) {
        json_t *dim = json_array_get(shape, (size_t)d);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0)
            return fail_at(err, err_len, path, 0,
                           "tensor '%s': shape[%d] is not a non-negative integer", name, d);
        info->shape[d] = json_integer_value(dim);
    }
    json_t *b = json_array_get(offsets, 0), *e = json_array_get(offsets, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b) || (size_t)json_integer_value(e) > data_len)
        return fail_at(err, err_len, path, 0,
                       "tensor '%s': data_offsets out of range (data is %zu bytes)", name,
                       data_len);
    info->begin = (size_t)json_integer_value(b);
    info->end = (size_t)json_integer_value(e);
    size_t bytes = elem;  // in size_t without wrapping: a shape past it is refused
    for (int d = 0; d < info->ndim; d++)
        if (__builtin_mul_overflow(bytes, (size_t)info->shape[d], &bytes))
            return fail_at(err, err_len, path, 0, "tensor '%s': its shape is too large", name);
    if (info->end - info->begin != bytes)
        return fail_at(err, err_len, path, 0,
                       "tensor '%s': %zu bytes do not match dtype %s and its shape", name,
                       info->end - info->begin, info->dtype);
    return 0;
}

int safetensors_read(const char *path, SafeTensorsFile *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    out->path = strdup(path);
    if (input_file_check(path, err, err_len) != 0) return -1;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return fail_at(err, err_len, path, 0, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 8) {
        close(fd);
        return fail_at(err, err_len, path, 0, "not a safetensors file (bad header length)");
    }
    const size_t file_len = (size_t)st.st_size;
    void *map = mmap(NULL, file_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return fail_at(err, err_len, path, 0, "cannot map: %s", strerror(errno));
    out->map = map;
    out->map_len = file_len;
    uint64_t header_len = 0;
    memcpy(&header_len, map, 8);
    if (header_len > SAFETENSORS_MAX_HEADER)
        return fail_at(err, err_len, path, 0,
                       "not a safetensors file: a header of %llu bytes, over the format's "
                       "limit of %d", (unsigned long long)header_len, SAFETENSORS_MAX_HEADER);
    if (header_len > (uint64_t)file_len - 8)
        return fail_at(err, err_len, path, 0, "not a safetensors file (bad header length)");
    out->data = (const uint8_t *)map + 8 + header_len;
    out->data_len = file_len - 8 - (size_t)header_len;
    char *text = xmalloc(header_len + 1);
    memcpy(text, (const uint8_t *)map + 8, header_len);
    text[header_len] = '\0';
    json_error_t jerr;
    json_t *header = json_loads(text, 0, &jerr);
    free(text);
    if (!json_is_object(header)) {
        json_decref(header);
        return fail_at(err, err_len, path, 0, "header is not a JSON object: %s", jerr.text);
    }
    out->tensors = xcalloc(json_object_size(header), sizeof(SafeTensorInfo));
    int rc = 0;
    const char *key;
    json_t *value;
    json_object_foreach(header, key, value) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(value)) {
                rc = fail_at(err, err_len, path, 0, "__metadata__ is not an object");
                break;
            }
            out->meta = xcalloc(json_object_size(value), sizeof(SafeTensorMeta));
            const char *mk;
            json_t *mv;
            json_object_foreach(value, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = fail_at(err, err_len, path, 0, "__metadata__.%s is not a string", mk);
                    break;
                }
                out->meta[out->n_meta].key = strdup(mk);
                out->meta[out->n_meta].value = strdup(json_string_value(mv));
                out->n_meta++;
            }
            if (rc) break;
            continue;
        }
        if (!json_is_object(value)) {
            rc = fail_at(err, err_len, path, 0, "tensor '%s' is not an object", key);
            break;
        }
        rc = parse_entry(path, key, value, out->data_len, &out->tensors[out->n_tensors], err, err_len);
        if (out->tensors[out->n_tensors].name) out->n_tensors++;
        if (rc) break;
    }
    json_decref(header);
    if (rc) return rc;
    // Tensors must not overlap (checked on a sorted copy; the file keeps header order).
    SafeTensorInfo *sorted = xmalloc((size_t)out->n_tensors * sizeof *sorted);
    memcpy(sorted, out->tensors, (size_t)out->n_tensors * sizeof *sorted);
    qsort(sorted, (size_t)out->n_tensors, sizeof *sorted, compare_begin);
    for (int i = 1; i < out->n_tensors && rc == 0; i++)
        if (sorted[i].begin < sorted[i - 1].end)
            rc = fail_at(err, err_len, path, 0, "tensors '%s' and '%s' overlap", sorted[i - 1].name,
                         sorted[i].name);
    free(sorted);
    return rc;
}

void safetensors_file_free(SafeTensorsFile *f) {
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free((char *)f->meta[i].key);
        free((char *)f->meta[i].value);
    }
    free(f->tensors);
    free(f->meta);
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const SafeTensorInfo *safetensors_find(const SafeTensorsFile *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *safetensors_meta(const SafeTensorsFile *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    return NULL;
}

int safetensors_copy_f32(const SafeTensorsFile *f, const char *name, int ndim,
                         const int64_t *shape, float *dst, char *err, size_t err_len) {
    const SafeTensorInfo *t = safetensors_find(f, name);
    if (!t) return fail_at(err, err_len, f->path, 0, "tensor '%s' is missing", name);
    const bool f32 = strcmp(t->dtype, "F32") == 0, bf16 = strcmp(t->dtype, "BF16") == 0;
    if (!f32 && !bf16 && strcmp(t->dtype, "F16") != 0)
        return fail_at(err, err_len, f->path, 0,
                       "tensor '%s' has dtype %s, expected F32, BF16 or F16", name, t->dtype);
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char want[64] = "", got[64] = "";
        for (int d = 0; d < ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "",
                     (long long)shape[d]);
        for (int d = 0; d < t->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "," : "",
                     (long long)t->shape[d]);
        return fail_at(err, err_len, f->path, 0, "tensor '%s' has shape [%s], expected [%s]", name,
                       got, want);
    }
    const uint8_t *src = f->data + t->begin;
    const size_t n = numel_of(t->ndim, t->shape);
    if (f32) {
        memcpy(dst, src, n * sizeof(float));
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);  // the map gives no 2-byte alignment guarantee
        dst[i] = bf16 ? bf16_to_float(h) : f16_to_float(h);
    }
    return 0;
}

void safetensors_table_entries(const ParamTable *table, const char *prefix, const float *buffer,
                               SafeTensorOut *out) {
    for (int i = 0; i < table->n_tensors; i++) {
        const ParamTensor *t = &table->tensors[i];
        size_t len = strlen(prefix) + strlen(t->name) + 1;
        char *name = xmalloc(len);
        snprintf(name, len, "%s%s", prefix, t->name);
        out[i] = (SafeTensorOut){.name = name, .ndim = t->ndim, .data = buffer + t->offset};
        for (int d = 0; d < t->ndim; d++) out[i].shape[d] = t->shape[d];
    }
}

void safetensors_entries_free(SafeTensorOut *entries, int n) {
    for (int i = 0; i < n; i++) free((char *)entries[i].name);
}

int safetensors_load_table(const SafeTensorsFile *f, const ParamTable *table, const char *prefix,
                           float *buffer, char *err, size_t err_len) {
    for (int i = 0; i < table->n_tensors; i++) {
        const ParamTensor *t = &table->tensors[i];
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        if (safetensors_copy_f32(f, name, t->ndim, t->shape, buffer + t->offset, err, err_len))
            return -1;
    }
    return 0;
}
