#define _POSIX_C_SOURCE 200809L
#include "trainer/run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"

// Up to three of the directory's entries ("a, b, c, ...") into names; the entry count.
static int list_entries(DIR *d, char *names, size_t len) {
    int n = 0;
    size_t used = 0;
    names[0] = '\0';
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (n < 3 && used < len) used += (size_t)snprintf(names + used, len - used, "%s%s", n ? ", " : "", e->d_name);
        else if (n == 3 && used < len) used += (size_t)snprintf(names + used, len - used, ", ...");
        n++;
    }
    return n;
}

// Whether the checkpoint directory `resume` lies directly in out_dir (same inode).
static bool resume_is_in(const char *resume, const struct stat *out) {
    char *copy = strdup(resume);
    struct stat parent;
    const bool in = copy && stat(dirname(copy), &parent) == 0 && parent.st_dev == out->st_dev &&
                    parent.st_ino == out->st_ino;
    free(copy);
    return in;
}

int run_dir_check(const char *out_dir, const char *resume, bool overwrite, char *err,
                  size_t err_len) {
    struct stat st;
    if (stat(out_dir, &st) != 0) {
        if (errno == ENOENT) return 0;
        return fail(err, err_len, "out_dir '%s': %s", out_dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) return fail(err, err_len, "out_dir '%s' is not a directory", out_dir);
    DIR *d = opendir(out_dir);
    if (!d) return fail(err, err_len, "out_dir '%s': %s", out_dir, strerror(errno));
    char names[512];
    const int n = list_entries(d, names, sizeof names);
    closedir(d);
    if (n == 0 || overwrite || (resume && resume_is_in(resume, &st))) return 0;
    return fail(err, err_len,
                "out_dir '%s' already holds a run (%s): resume it with --set "
                "train.resume=%s/checkpoint-N, choose another out_dir, or set "
                "train.overwrite=true to replace it", out_dir, names, out_dir);
}

// The step of a "checkpoint-N" entry name (digits only after the dash), or -1.
static long checkpoint_step(const char *name) {
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11]) return -1;
    char *end;
    const long step = strtol(name + 11, &end, 10);
    return *end || step < 0 ? -1 : step;
}

// The steps of out_dir's checkpoint-N folders, ascending, into *steps (malloc'd); their
// number, or -1 with a message.
static int list_checkpoints(const char *out_dir, long **steps, char *err, size_t err_len) {
    DIR *d = opendir(out_dir);
    if (!d) return fail(err, err_len, "out_dir '%s': %s", out_dir, strerror(errno));
    int n = 0, cap = 0;
    *steps = NULL;
    for (struct dirent *e; (e = readdir(d));) {
        const long step = checkpoint_step(e->d_name);
        if (step < 0) continue;
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        ARRAY_PUSH(*steps, n, cap, step);
    }
    closedir(d);
    for (int i = 1; i < n; i++)  // insertion sort: a run has few checkpoints
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            const long t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return n;
}

int run_dir_latest_checkpoint(const char *out_dir, char *dir, size_t dir_len, char *err,
                              size_t err_len) {
    long *steps;
    const int n = list_checkpoints(out_dir, &steps, err, err_len);
    if (n < 0) return -1;
    if (n == 0) {
        free(steps);
        return fail(err, err_len, "out_dir '%s' holds no checkpoint-N folder to resume", out_dir);
    }
    snprintf(dir, dir_len, "%s/checkpoint-%06ld", out_dir, steps[n - 1]);
    struct stat st;
    if (stat(dir, &st) != 0) snprintf(dir, dir_len, "%s/checkpoint-%ld", out_dir, steps[n - 1]);
    free(steps);
    return 0;
}

// The folder of step `step` in out_dir (checkpoint-%06ld as written, else as found).
static void checkpoint_path(const char *out_dir, long step, char *path, size_t len) {
    struct stat st;
    snprintf(path, len, "%s/checkpoint-%06ld", out_dir, step);
    if (stat(path, &st) != 0) snprintf(path, len, "%s/checkpoint-%ld", out_dir, step);
}

int run_dir_set_aside_later(const char *out_dir, long step, char *err, size_t err_len) {
    long *steps;
    const int n = list_checkpoints(out_dir, &steps, err, err_len);
    if (n < 0) return -1;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (steps[i] <= step) continue;
        char from[4200], aside[4200], to[4700];
        checkpoint_path(out_dir, steps[i], from, sizeof from);
        snprintf(aside, sizeof aside, "%s/abandoned", out_dir);
        if (mkdir(aside, 0777) != 0 && errno != EEXIST) {
            rc = fail(err, err_len, "%s: %s", aside, strerror(errno));
            break;
        }
        const char *base = strrchr(from, '/') + 1;
        snprintf(to, sizeof to, "%s/%s", aside, base);
        struct stat st;
        for (int k = 2; stat(to, &st) == 0; k++) snprintf(to, sizeof to, "%s/%s.%d", aside, base, k);
        if (rename(from, to) != 0) rc = fail(err, err_len, "moving %s to %s: %s", from, to, strerror(errno));
        else printf("resume: %s is later than the resumed step %ld: moved to %s\n", from, step, to);
    }
    free(steps);
    return rc;
}

// Removes a checkpoint folder: its files, then the folder.
static int remove_checkpoint(const char *dir, char *err, size_t err_len) {
    DIR *d = opendir(dir);
    if (!d) return fail(err, err_len, "%s: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[4600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) rc = fail(err, err_len, "removing %s: %s", path, strerror(errno));
    }
    closedir(d);
    if (rc == 0 && rmdir(dir) != 0) rc = fail(err, err_len, "removing %s: %s", dir, strerror(errno));
    return rc;
}

int run_dir_rotate(const char *out_dir, long step, int keep, char *err, size_t err_len) {
    long *steps;
    const int n = list_checkpoints(out_dir, &steps, err, err_len);
    if (n < 0) return -1;
    int kept = 0, rc = 0;
    for (int i = n - 1; i >= 0 && rc == 0; i--) {
        if (steps[i] > step || kept++ < keep) continue;
        char dir[4200];
        checkpoint_path(out_dir, steps[i], dir, sizeof dir);
        rc = remove_checkpoint(dir, err, err_len);
        if (rc == 0) printf("train.save_total_limit %d: removed %s\n", keep, dir);
    }
    free(steps);
    return rc;
}
