// Device buffers inside one allocation: typed pointers at the offsets of a layout (the
// CUDA model: model/model_arena.h), and a bump allocator that sizes the allocation by
// carving once without a base (the CUDA decoder).
#pragma once
#include <stddef.h>
#include "model/model_arena.h"

// The buffer at `offset` bytes into the allocation at base.
template <typename T>
static T *arena_at(void *base, size_t offset) {
    return reinterpret_cast<T *>(static_cast<char *>(base) + offset);
}

// Bump allocation inside the arena. With base == NULL it only counts bytes, so the
// same carve function sizes the arena and then hands out its pointers.
typedef struct {
    char *base;
    size_t used;
} Arena;

template <typename T>
static T *arena_take(Arena *a, size_t count) {
    const size_t start = arena_reserve(&a->used, count * sizeof(T));
    return a->base ? reinterpret_cast<T *>(a->base + start) : nullptr;
}
