#define _POSIX_C_SOURCE 200809L
#include "trainer/backend.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"

// A visible NVIDIA GPU shows up as a device node; no CUDA library is needed to know.
static bool gpu_visible(void) { return access("/dev/nvidia0", F_OK) == 0; }

Backend backend_choose(const char *name, char *why, size_t why_len) {
    if (!name) fatal("config key 'backend': must be \"auto\", \"cpu\" or \"cuda\", got null");
    if (strcmp(name, "cpu") == 0) {
        snprintf(why, why_len, "backend: cpu (requested)");
        return BACKEND_CPU;
    }
    if (strcmp(name, "cuda") == 0)
        fatal("config key 'backend': \"cuda\" requested but the CUDA training backend is not "
              "built yet; use \"cpu\" or \"auto\"");
    if (strcmp(name, "auto") == 0) {
        snprintf(why, why_len, "backend: cpu (%s)",
                 gpu_visible() ? "a GPU is visible but the CUDA training backend is not built yet"
                               : "no CUDA device found");
        return BACKEND_CPU;
    }
    fatal("config key 'backend': must be \"auto\", \"cpu\" or \"cuda\", got \"%s\"", name);
}
