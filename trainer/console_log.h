// The console mirrored into out_dir/train.log: what the run prints on stdout and stderr
// goes on to the terminal as before and, once the run's folder exists, into its log too
// (what was printed before that is kept and written first).
#pragma once
#include <stdbool.h>
#include <stddef.h>

// Starts mirroring: stdout and stderr become pipes read by two threads. Returns 0, or -1
// with a message (the console is then left as it was).
int console_log_begin(char *err, size_t err_len);
// From now on into dir/train.log (appended to when `append`, a resume; else replaced),
// starting with what was printed since console_log_begin. A no-op without it. Returns
// 0, or -1 with a message.
int console_log_attach(const char *dir, bool append, char *err, size_t err_len);
// Stops mirroring (also run at exit): the console is restored, the threads drain the
// pipes, the log is closed.
void console_log_end(void);
