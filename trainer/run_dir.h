// The run directory (out_dir) is protected: a run goes into an empty or new
// directory, into its own directory when it resumes a checkpoint there, or over
// another run only when asked (train.overwrite=true).
#pragma once
#include <stdbool.h>
#include <stddef.h>

// Checks out_dir for a run that resumes `resume` (NULL: a new run). Returns 0, or -1
// with a message that names out_dir, what it holds and the ways out.
int run_dir_check(const char *out_dir, const char *resume, bool overwrite, char *err,
                  size_t err_len);
