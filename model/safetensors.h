// safetensors I/O (F32 tensors): 8-byte little-endian header length, a JSON header
// {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}},
// then the raw little-endian data. Writes go to <path>.tmp, are fsync'd and renamed,
// so a crash never leaves a truncated file under the final name.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "model/model.h"

#define SAFETENSORS_MAX_DIMS 4
// The format's cap on the JSON header (the reference reader's MAX_HEADER_SIZE): a longer
// claimed length is refused from its 8 bytes, before anything of that size is read.
#define SAFETENSORS_MAX_HEADER 100000000

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const float *data;      // numel floats (dtype NULL or "F32")
    const char *dtype;      // NULL: "F32"; "BF16" or "F16": data16 holds the values
    const uint16_t *data16; // numel 16-bit values
} SafeTensorOut;

typedef struct {
    const char *key, *value;
} SafeTensorMeta;

// Exact widening of BF16 and IEEE F16 bit patterns to float.
float bf16_to_float(uint16_t h);
float f16_to_float(uint16_t h);
// Rounding to nearest even (NaN stays NaN; F16 overflows to infinity).
uint16_t float_to_bf16(float f);
uint16_t float_to_f16(float f);

// Returns 0, or -1 with a message (naming the path) in err.
int safetensors_write(const char *path, const SafeTensorOut *tensors, int n_tensors,
                      const SafeTensorMeta *meta, int n_meta, char *err, size_t err_len);

typedef struct {
    char *name;
    char dtype[16];
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    size_t begin, end;  // byte offsets into the data section
} SafeTensorInfo;

typedef struct {
    char *path;
    const uint8_t *data;  // data section, inside the read-only memory map of the file
    size_t data_len;
    void *map;            // the whole file, mmap'd (never read into a malloc'd buffer)
    size_t map_len;
    SafeTensorInfo *tensors;
    int n_tensors;
    SafeTensorMeta *meta;  // strings owned by the file
    int n_meta;
} SafeTensorsFile;

// Maps a file (mmap, read-only) and validates it (a header of at most
// SAFETENSORS_MAX_HEADER bytes, header JSON, offsets in range and non-overlapping with
// the declared dtype and shape). Returns 0, or -1 with "path: what"
// in err. Tensor bytes are paged in only when copied.
int safetensors_read(const char *path, SafeTensorsFile *out, char *err, size_t err_len);
void safetensors_file_free(SafeTensorsFile *f);
const SafeTensorInfo *safetensors_find(const SafeTensorsFile *f, const char *name);  // NULL if absent
const char *safetensors_meta(const SafeTensorsFile *f, const char *key);               // NULL if absent
// Copies a tensor of dtype F32, BF16 or F16 whose shape must equal `shape` into dst as
// fp32 (exact: every BF16/F16 value is a float). Returns 0, or -1 with a message naming
// the tensor (absent, another dtype, wrong shape).
int safetensors_copy_f32(const SafeTensorsFile *f, const char *name, int ndim,
                         const int64_t *shape, float *dst, char *err, size_t err_len);

// One entry per table tensor, named prefix + HF name (e.g. "exp_avg." for optimizer
// moments), pointing into `buffer` at the tensor's offset. Names are malloc'd: free
// with safetensors_entries_free.
void safetensors_table_entries(const ParamTable *table, const char *prefix, const float *buffer,
                               SafeTensorOut *out);
void safetensors_entries_free(SafeTensorOut *entries, int n);
// Loads every tensor of the table (named prefix + HF name) from the file into `buffer`
// at the table's offsets; extra tensors in the file are ignored.
int safetensors_load_table(const SafeTensorsFile *f, const ParamTable *table, const char *prefix,
                           float *buffer, char *err, size_t err_len);
