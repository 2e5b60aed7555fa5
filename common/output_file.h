// The one way onepass writes a file, and the record of the files it has read:
//   - a regular file (or a new name) is written to a temporary file beside it, checked,
//     fsync'd and renamed over it, so it is either the old or the whole new content;
//   - anything else that is not a directory (/dev/null, a FIFO, a terminal) is written
//     directly: renaming over it would replace the device or the pipe with a file;
//   - a symbolic link is followed: its target is what gets written (the link stays);
//   - an output that is one of the process's inputs (same device and inode, whatever
//     the name) is refused, so `--out` equal to the data set cannot overwrite it.
// Readers record their inputs with input_file_check, which also refuses a path that is
// not a regular file, naming it.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

// Refuses (message "path: not a regular file" / "path: cannot open: ...") anything but
// a regular file and records the file as an input. Returns 0, or -1 with the message.
int input_file_check(const char *path, char *err, size_t err_len);

// Opens path for reading only when it is a regular file, checked on the opened
// descriptor (the open never waits on a FIFO, and a name swapped after a check is still
// refused), and records it as input_file_check does. Returns the stream, or NULL with
// "path: not a regular file" or "path: cannot open: ..." in err.
FILE *input_file_open(const char *path, char *err, size_t err_len);

// The whole content of a regular file (input_file_open) of at most max_bytes: a larger
// one is refused by its size ("path: N bytes, over the limit of M") before it is read.
// Returns it malloc'd with a NUL after it (*len: its length), or NULL with a message.
char *input_file_read(const char *path, size_t max_bytes, size_t *len, char *err,
                      size_t err_len);
// The same for a file the run itself wrote and rewrites (not recorded as an input).
char *own_file_read(const char *path, size_t max_bytes, size_t *len, char *err,
                    size_t err_len);

// Whether path is (by device and inode) a file recorded by input_file_check; *input
// gets the path it was recorded under.
bool output_is_input(const char *path, const char **input);

typedef struct {
    FILE *f;
    char *path;  // where the content ends up (a symbolic link resolved)
    char *tmp;   // the temporary file beside it; NULL when written directly
} OutputFile;

// Opens path for writing under the rules above. Returns 0, or -1 with a message.
int output_open(OutputFile *o, const char *path, char *err, size_t err_len);
// Checks every write, flushes, fsyncs and closes, then renames the temporary file over
// the target (and fsyncs its directory). On any failure the target is left as it was
// and the message names the path. Returns 0 or -1.
int output_commit(OutputFile *o, char *err, size_t err_len);
// Closes and removes the temporary file, leaving the target as it was.
void output_discard(OutputFile *o);

// output_open + len bytes + output_commit. Returns 0, or -1 with a message.
int write_file_atomic(const char *path, const void *data, size_t len, char *err, size_t err_len);

// fsync of the directory holding path, so a rename into it is durable.
void fsync_parent_dir(const char *path);
