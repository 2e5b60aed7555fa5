#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE  // realpath
#include "common/output_file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"

typedef struct {
    dev_t dev;
    ino_t ino;
    char *path;
} InputFile;

static pthread_mutex_t inputs_lock = PTHREAD_MUTEX_INITIALIZER;
static InputFile *inputs;
static int n_inputs, inputs_cap;

static void record_input(const char *path, const struct stat *st_in) {
    const struct stat st = *st_in;
    pthread_mutex_lock(&inputs_lock);
    bool known = false;
    for (int i = 0; i < n_inputs && !known; i++)
        known = inputs[i].dev == st.st_dev && inputs[i].ino == st.st_ino;
    if (!known) {
        const InputFile in = {.dev = st.st_dev, .ino = st.st_ino, .path = strdup(path)};
        ARRAY_PUSH(inputs, n_inputs, inputs_cap, in);
    }
    pthread_mutex_unlock(&inputs_lock);
}

int input_file_check(const char *path, char *err, size_t err_len) {
    struct stat st;
    if (stat(path, &st) != 0) return fail_at(err, err_len, path, 0, "cannot open: %s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return fail_at(err, err_len, path, 0, "not a regular file");
    record_input(path, &st);
    return 0;
}

static FILE *regular_file_open(const char *path, bool record, char *err, size_t err_len) {
    // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a
    // writer; the descriptor is then refused as not a regular file.
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fail_at(err, err_len, path, 0, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    const int flags = fcntl(fd, F_GETFL);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || flags < 0 ||
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        close(fd);
        fail_at(err, err_len, path, 0, "not a regular file");
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        fail_at(err, err_len, path, 0, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (record) record_input(path, &st);
    return f;
}

FILE *input_file_open(const char *path, char *err, size_t err_len) {
    return regular_file_open(path, true, err, err_len);
}

static char *regular_file_read(const char *path, bool record, size_t max_bytes, size_t *len,
                               char *err, size_t err_len) {
    FILE *f = regular_file_open(path, record, err, err_len);
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || (uint64_t)st.st_size > (uint64_t)max_bytes) {
        fclose(f);
        fail_at(err, err_len, path, 0, "%lld bytes, over the limit of %zu", (long long)st.st_size,
                max_bytes);
        return NULL;
    }
    // Reads at most max_bytes + 1, so a file growing while read stays bounded.
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *data = xmalloc(cap + 1);
    for (size_t got; n <= max_bytes && (got = fread(data + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap && n <= max_bytes) {
            cap = cap * 2 < max_bytes + 1 ? cap * 2 : max_bytes + 1;
            data = xrealloc(data, cap + 1);
        }
    }
    const bool failed = ferror(f);
    fclose(f);
    if (failed || n > max_bytes) {
        free(data);
        if (failed) fail_at(err, err_len, path, 0, "read failed");
        else fail_at(err, err_len, path, 0, "more than %zu bytes (it grew while read)", max_bytes);
        return NULL;
    }
    data[n] = '\0';
    *len = n;
    return data;
}

bool output_is_input(const char *path, const char **input) {
    struct stat st;
    if (stat(path, &st) != 0) return false;
    bool found = false;
    pthread_mutex_lock(&inputs_lock);
    for (int i = 0; i < n_inputs && !found; i++) {
        found = inputs[i].dev == st.st_dev && inputs[i].ino == st.st_ino;
        if (found && input) *input = inputs[i].path;
    }
    pthread_mutex_unlock(&inputs_lock);
    return found;
}

void fsync_parent_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

int output_open(OutputFile *o, const char *path, char *err, size_t err_len) {
    *o = (OutputFile){0};
    const char *input = NULL;
    if (output_is_input(path, &input))
        return fail_at(err, err_len, path, 0, "refusing to overwrite an input of this run (%s)", input);
    struct stat st;
    const bool exists = stat(path, &st) == 0;  // follows a symbolic link
    if (exists && S_ISDIR(st.st_mode)) return fail_at(err, err_len, path, 0, "is a directory");
    if (exists && !S_ISREG(st.st_mode)) {
        // A device, FIFO or socket: write it in place, never replace it.
        o->f = fopen(path, "wb");
        if (!o->f) return fail_at(err, err_len, path, 0, "cannot open for writing: %s", strerror(errno));
        o->path = strdup(path);
        return 0;
    }
    char *target = NULL;
    if (exists) target = realpath(path, NULL);  // rename over the link's target, not the link
    o->path = target ? target : strdup(path);
    const size_t len = strlen(o->path) + 16;
    o->tmp = xmalloc(len);
    snprintf(o->tmp, len, "%s.tmpXXXXXX", o->path);
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        fail_at(err, err_len, path, 0, "cannot create a temporary file beside it: %s", strerror(errno));
        free(o->tmp);
        free(o->path);
        *o = (OutputFile){0};
        return -1;
    }
    mode_t mask = umask(0);  // mkstemp makes 0600; give the output ordinary permissions
    umask(mask);
    if (fchmod(fd, exists ? (st.st_mode & 07777) : (0666 & ~mask)) != 0) { /* best effort */ }
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        close(fd);
        output_discard(o);
        return fail_at(err, err_len, path, 0, "%s", strerror(errno));
    }
    return 0;
}

int output_commit(OutputFile *o, char *err, size_t err_len) {
    bool ok = fflush(o->f) == 0 && !ferror(o->f);
    if (ok && o->tmp) ok = fsync(fileno(o->f)) == 0;
    int saved_errno = errno;
    if (fclose(o->f) != 0 && ok) {
        ok = false;
        saved_errno = errno;
    }
    o->f = NULL;
    if (ok && o->tmp && rename(o->tmp, o->path) != 0) {
        ok = false;
        saved_errno = errno;
    }
    if (!ok) {
        fail_at(err, err_len, o->path, 0, "write failed: %s", strerror(saved_errno));
        output_discard(o);
        return -1;
    }
    if (o->tmp) fsync_parent_dir(o->path);
    free(o->tmp);
    free(o->path);
    *o = (OutputFile){0};
    return 0;
}

void output_discard(OutputFile *o) {
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    *o = (OutputFile){0};
}

int write_file_atomic(const char *path, const void *data, size_t len, char *err, size_t err_len) {
    OutputFile o;
    if (output_open(&o, path, err, err_len) != 0) return -1;
    if (len > 0 && fwrite(data, 1, len, o.f) != len) {
        const int saved_errno = errno;
        char *where = strdup(o.path);
        output_discard(&o);
        fail_at(err, err_len, where ? where : path, 0, "write failed: %s", strerror(saved_errno));
        free(where);
        return -1;
    }
    return output_commit(&o, err, err_len);
}

char *input_file_read(const char *path, size_t max_bytes, size_t *len, char *err,
                      size_t err_len) {
    return regular_file_read(path, true, max_bytes, len, err, err_len);
}

char *own_file_read(const char *path, size_t max_bytes, size_t *len, char *err,
                    size_t err_len) {
    return regular_file_read(path, false, max_bytes, len, err, err_len);
}
