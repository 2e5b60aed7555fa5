#define _POSIX_C_SOURCE 200809L
#include "trainer/run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
