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

// The checkpoint-N folder of out_dir with the largest N into dir. Returns 0, or -1 with a
// message when out_dir has none.
int run_dir_latest_checkpoint(const char *out_dir, char *dir, size_t dir_len, char *err,
                              size_t err_len);
// A resume of step `step` in out_dir: its checkpoint-N folders with N > step (the
// abandoned run's later ones) move to out_dir/abandoned/ (named checkpoint-N, or
// checkpoint-N.2, ... when taken), each said on stdout. Returns 0, or -1 with a message.
int run_dir_set_aside_later(const char *out_dir, long step, char *err, size_t err_len);
// Removes out_dir's checkpoint-N folders but the `keep` newest (N <= step only), each
// said on stdout. Returns 0, or -1 with a message.
int run_dir_rotate(const char *out_dir, long step, int keep, char *err, size_t err_len);
