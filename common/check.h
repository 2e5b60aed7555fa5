// Error handling shared by every stage: fail loudly, name the place.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdint.h>

// Prints "onepass: error: <message>" to stderr and exits with status 1.
__attribute__((noreturn, format(printf, 1, 2))) static inline void fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("onepass: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) fatal("out of memory allocating %zu bytes", n);
    return p;
}

static inline void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) fatal("out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

static inline void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) fatal("out of memory reallocating %zu bytes", n);
    return p;
}

// Growable array append: ARRAY_PUSH(ptr, len, cap, value).
#define ARRAY_PUSH(ptr, len, cap, value)                                   \
    do {                                                                   \
        if ((len) == (cap)) {                                              \
            (cap) = (cap) ? 2 * (cap) : 16;                                \
            (ptr) = xrealloc((ptr), (size_t)(cap) * sizeof(*(ptr)));       \
        }                                                                  \
        (ptr)[(len)++] = (value);                                          \
    } while (0)

// Test exit code that CTest reports as "Skipped" (SKIP_RETURN_CODE 77).
#define EXIT_SKIP 77

// Three idioms, one each:
//   CHECK(cond, "fmt", ...)  a programming error (a broken invariant or a bad argument
//                            from our own code): fatal, prefixed with the source file and
//                            line of the check. Never for bad input.
//   fail(err, err_len, ...)  a recoverable error reported to the caller: message into err,
//                            returns -1. Messages say what is wrong, not where.
//   fail_at(...)             the one place that prefixes an input location "path:line: "
//                            (line 0: "path: ") to a message.
__attribute__((noreturn, format(printf, 3, 4))) static inline void check_failed(
    const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "onepass: error: %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}
#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (!(cond)) check_failed(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

// Writes the message into err and returns -1, so `return fail(err, err_len, "...");`
// reads naturally.
__attribute__((format(printf, 3, 4))) static inline int fail(char *err, size_t err_len,
                                                             const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
    return -1;
}

// splitmix64: our own well-mixed generator, so seeded data, initialisation and
// shuffles are the same bytes on every platform and library version.
static inline uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// fail() with the input location in front: "path:line: message" ("path: message" when
// line is 0). The only function that formats input locations.
__attribute__((format(printf, 5, 6))) static inline int fail_at(char *err, size_t err_len,
                                                                const char *path, int line,
                                                                const char *fmt, ...) {
    int n = line > 0 ? snprintf(err, err_len, "%s:%d: ", path, line)
                     : snprintf(err, err_len, "%s: ", path);
    if (n < 0 || (size_t)n >= err_len) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, err_len - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}
