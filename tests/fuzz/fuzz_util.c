// The exit and fprintf wrappers of tests/fuzz/fuzz_util.h (linked with -Wl,--wrap=exit
// -Wl,--wrap=fprintf), and the shared helpers.
#define _GNU_SOURCE
#include "fuzz_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

jmp_buf fuzz_exit_env;
volatile int fuzz_exit_armed;
static volatile int check_failed_seen;

void __real_exit(int status) __attribute__((noreturn));
int __real_fprintf(FILE *f, const char *fmt, ...);

// check_failed (common/check.h) writes this prefix before its message.
int __wrap_fprintf(FILE *f, const char *fmt, ...) {
    if (fmt && strcmp(fmt, "onepass: error: %s:%d: ") == 0) check_failed_seen = 1;
    va_list ap;
    va_start(ap, fmt);
    const int n = vfprintf(f, fmt, ap);
    va_end(ap);
    return n;
}

void __wrap_exit(int status) {
    if (check_failed_seen) {
        fputs("fuzz: a CHECK failed (a broken invariant, not a refusal)\n", stdout);
        abort();
    }
    if (fuzz_exit_armed) {
        fuzz_exit_armed = 0;
        longjmp(fuzz_exit_env, 1);
    }
    __real_exit(status);
}

static char temp_paths[4][64], temp_suffixes[4][16];
static int n_temp;

static void remove_temp_files(void) {
    for (int i = 0; i < n_temp; i++) unlink(temp_paths[i]);
}

void fuzz_init(void) {
    static int done;
    if (done) return;
    done = 1;
    setenv("OMP_NUM_THREADS", "1", 1);
    if (!getenv("FUZZ_VERBOSE")) {
        FILE *null = fopen("/dev/null", "w");
        if (null) stderr = null;
    }
    atexit(remove_temp_files);
}

const char *fuzz_temp_file(const char *suffix, const uint8_t *data, size_t size) {
    int slot = -1;
    for (int i = 0; i < n_temp; i++)
        if (strcmp(temp_suffixes[i], suffix) == 0) slot = i;
    if (slot < 0) {
        if (n_temp == 4) abort();
        slot = n_temp++;
        snprintf(temp_suffixes[slot], sizeof temp_suffixes[slot], "%s", suffix);
        snprintf(temp_paths[slot], sizeof temp_paths[slot], "/tmp/onepass_fuzz_%d_%d%s",
                 (int)getpid(), slot, suffix);
    }
    FILE *f = fopen(temp_paths[slot], "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    return temp_paths[slot];
}

const char *fuzz_source_path(const char *relative) {
    static char path[4][4096];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", ONEPASS_SOURCE_DIR, relative);
    return p;
}
