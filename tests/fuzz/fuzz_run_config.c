// The run configuration: the input up to its first NUL is a config file, each later
// NUL-separated piece a --set KEY=VALUE (at most 16); config_load resolves them, and an
// accepted configuration is dumped and freed.
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "trainer/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    const uint8_t *nul = memchr(data, 0, size);
    const size_t file_len = nul ? (size_t)(nul - data) : size;
    const char *path = fuzz_temp_file(".json", data, file_len);
    char *rest = malloc(size - file_len + 1);
    memcpy(rest, data + file_len, size - file_len);
    rest[size - file_len] = '\0';
    char *overrides[16];
    int n = 0;
    for (size_t i = 0; nul && i < size - file_len && n < 16;) {
        char *piece = rest + i + 1;  // after the NUL
        if (i + 1 > size - file_len) break;
        overrides[n++] = piece;
        i += 1 + strlen(piece);
    }
    RunConfig *c = NULL;
    FUZZ_TRY(c = config_load(path, n, overrides));
    if (c) {
        free(config_dump(c));
        config_free(c);
    }
    free(rest);
    return 0;
}
