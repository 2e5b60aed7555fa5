// metrics.jsonl: a write that fails (here: the file size limit, as on
// a full disk) is reported once, and the file keeps only complete JSON lines; the
// resume-time rewrite keeps the lines up to the checkpoint's step.
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/check.h"
#include "tests/test_util.h"
#include "trainer/metrics.h"

// Every line of path parses as a JSON object and ends with '\n'; returns the count
// (-1: a bad line).
static int valid_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int count = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        if (!json_is_object(o) || line[n - 1] != '\n') count = -1000000;
        json_decref(o);
        count++;
    }
    free(line);
    fclose(f);
    return count < 0 ? -1 : count;
}

int main(void) {
    char dir[] = "/tmp/test_metrics_XXXXXX";
    if (!mkdtemp(dir)) fatal("mkdtemp failed");
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);

    MetricsLog log;
    EXPECT(metrics_open(&log, dir, 0, err, sizeof err) == 0, "open: %s", err);
    StepMetrics m = {.step = 1, .loss = 2.5, .lr = 1e-3, .mfu = -1};
    metrics_write(&log, &m);
    m.step = 2;
    metrics_write(&log, &m);
    EXPECT(!log.failed, "no failure yet");

    // A file size limit a little past the current size: the next lines fail part-way.
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)(ftell(log.f) + 60);
    EXPECT(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
    for (long s = 3; s <= 6; s++) {
        m.step = s;
        metrics_write(&log, &m);
    }
    setrlimit(RLIMIT_FSIZE, &old);
    EXPECT(log.failed, "the failure is recorded");
    EXPECT(log.failures_reported == 1, "reported once, not %d times", log.failures_reported);
    EXPECT(valid_lines(path) == 2, "only complete lines kept: %d", valid_lines(path));
    // Space again: writing goes on.
    m.step = 7;
    metrics_write(&log, &m);
    metrics_close(&log);
    EXPECT(valid_lines(path) == 3, "a line after the failure: %d", valid_lines(path));

    // The resume rewrite keeps steps <= 2 (atomically, through common/output_file.h).
    EXPECT(metrics_open(&log, dir, 2, err, sizeof err) == 0, "reopen: %s", err);
    metrics_close(&log);
    EXPECT(valid_lines(path) == 2, "rewrite kept %d lines", valid_lines(path));

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_finish();
}
