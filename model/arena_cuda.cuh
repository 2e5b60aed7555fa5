// A bump allocator over one device allocation: the CUDA model carves every activation
// buffer out of a single cudaMalloc, sized by carving once without a base.
#pragma once
#include <stddef.h>

// Every buffer of the arena starts on this boundary (what cuBLASLt prefers).
enum { ARENA_ALIGNMENT = 256 };

// Bump allocation inside the arena. With base == NULL it only counts bytes, so the
// same carve function sizes the arena and then hands out its pointers.
typedef struct {
    char *base;
    size_t used;
} Arena;

template <typename T>
static T *arena_take(Arena *a, size_t count) {
    const size_t start = (a->used + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
    a->used = start + count * sizeof(T);
    return a->base ? reinterpret_cast<T *>(a->base + start) : nullptr;
}
