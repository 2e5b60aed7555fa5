// Shared by the libFuzzer targets of tests/fuzz/ (built with -DONEPASS_FUZZ=ON and clang).
// onepass refuses bad input with fatal() (a message, exit status 1): under FUZZ_TRY such
// an exit returns to the target instead of ending the fuzzer, so a clean refusal is a
// normal outcome. A CHECK failure (a broken invariant, "onepass: error: FILE:LINE:")
// aborts instead, so libFuzzer reports it as a finding, as it does memory errors (ASan),
// undefined behaviour (UBSan), hangs and out-of-memory.
#pragma once
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

extern jmp_buf fuzz_exit_env;
extern volatile int fuzz_exit_armed;

// Runs the statement; a fatal() inside it comes back here (memory it held is leaked, so
// a target whose inputs are mostly refused by fatal() runs without leak checks).
#define FUZZ_TRY(stmt)                                     \
    do {                                                   \
        if (setjmp(fuzz_exit_env) == 0) {                  \
            fuzz_exit_armed = 1;                           \
            stmt;                                          \
        }                                                  \
        fuzz_exit_armed = 0;                               \
    } while (0)

// Once per process: stderr (onepass's messages) to /dev/null unless FUZZ_VERBOSE is set
// (sanitizer reports still reach the real stderr), one OpenMP thread.
void fuzz_init(void);
// A path of this process's own temporary file holding data[0..size) (rewritten each
// call; removed at exit). `suffix` ends its name (".json", ".model", "").
const char *fuzz_temp_file(const char *suffix, const uint8_t *data, size_t size);
// The path of a file of the source tree.
const char *fuzz_source_path(const char *relative);
