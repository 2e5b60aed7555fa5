// A fast 64-bit checksum (not cryptographic): detects corrupt or changed bytes in
// checkpoints and run inputs.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/check.h"

// 8 bytes a step, a multiply-xorshift mix per word, splitmix64 at the end.
static inline uint64_t checksum_bytes(const void *data, size_t len) {
    const unsigned char *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)len;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    for (; i < len; i++) h = (h ^ p[i]) * 0x94D049BB133111EBULL;
    return splitmix64(&h);
}
