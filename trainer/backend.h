// Backend choice for the `backend` config key. The core library is plain C: the
// GPU is detected at run time without linking CUDA.
#pragma once
#include <stddef.h>

typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } Backend;

// "cpu" | "cuda" | "auto". Writes the one-line reason for the choice into `why`
// (e.g. "backend: cpu (no CUDA device found)"). Fatal for an unknown name or for a
// backend that cannot run here.
Backend backend_choose(const char *name, char *why, size_t why_len);
