// `train export --from CHECKPOINT --out DIR [--dtype bf16|f16|f32]`: a Hugging Face model
// folder without the optimizer state (trainer/checkpoint.h).
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "common/check.h"
#include "trainer/checkpoint.h"

static const char *USAGE = "usage: train export --from CHECKPOINT --out DIR [--dtype bf16|f16|f32]";

int cmd_export(int argc, char **argv) {
    const char *from = NULL, *out = NULL, *dtype_name = NULL;
    for (int i = 0; i < argc; i++) {
        const char **slot = strcmp(argv[i], "--from") == 0    ? &from
                            : strcmp(argv[i], "--out") == 0   ? &out
                            : strcmp(argv[i], "--dtype") == 0 ? &dtype_name
                                                              : NULL;
        if (!slot || i + 1 >= argc) fatal("train export: unexpected argument '%s' (%s)", argv[i], USAGE);
        *slot = argv[++i];
    }
    if (!from || !out) fatal("train export: --from and --out are required (%s)", USAGE);
    char err[1024];
    SaveDtype dtype;
    if (dtype_name && save_dtype_parse(dtype_name, &dtype, err, sizeof err))
        fatal("train export: --dtype: %s", err);
    if (hf_export_checkpoint(from, out, dtype_name ? &dtype : NULL, err, sizeof err))
        fatal("train export: %s", err);
    printf("exported %s to %s\n", from, out);
    return 0;
}
