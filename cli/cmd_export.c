// `train export --from CHECKPOINT --out DIR [--dtype bf16|f16|f32] [--merge [--base DIR]]
// [--overwrite]`: a Hugging Face model folder without the optimizer state
// (trainer/checkpoint.h), a LoRA checkpoint's adapter folder, or with --merge that
// adapter merged into its base model; a non-empty --out is refused unless --overwrite.
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "common/check.h"
#include "trainer/checkpoint.h"

static const char *USAGE =
    "usage: train export --from CHECKPOINT --out DIR [--dtype bf16|f16|f32] [--merge [--base DIR]] "
    "[--overwrite]";

// Whether dir exists and holds an entry.
static bool non_empty_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool any = false;
    for (struct dirent *e; !any && (e = readdir(d));)
        any = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return any;
}

int cmd_export(int argc, char **argv) {
    const char *from = NULL, *out = NULL, *dtype_name = NULL, *base = NULL;
    bool overwrite = false, merge = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--overwrite") == 0 || strcmp(argv[i], "--merge") == 0) {
            *(argv[i][2] == 'o' ? &overwrite : &merge) = true;
            continue;
        }
        const char **slot = strcmp(argv[i], "--from") == 0    ? &from
                            : strcmp(argv[i], "--out") == 0   ? &out
                            : strcmp(argv[i], "--dtype") == 0 ? &dtype_name
                            : strcmp(argv[i], "--base") == 0  ? &base
                                                              : NULL;
        if (!slot || i + 1 >= argc) fatal("train export: unexpected argument '%s' (%s)", argv[i], USAGE);
        *slot = argv[++i];
    }
    if (!from || !out) fatal("train export: --from and --out are required (%s)", USAGE);
    if (!overwrite && non_empty_dir(out))
        fatal("train export: --out %s already holds files; choose another folder, or pass "
              "--overwrite to write over them", out);
    char err[1024];
    SaveDtype dtype;
    if (dtype_name && save_dtype_parse(dtype_name, &dtype, err, sizeof err))
        fatal("train export: --dtype: %s", err);
    if (base && !merge) fatal("train export: --base goes with --merge (%s)", USAGE);
    if (merge ? hf_export_merged(from, base, out, dtype_name ? &dtype : NULL, err, sizeof err)
              : hf_export_checkpoint(from, out, dtype_name ? &dtype : NULL, err, sizeof err))
        fatal("train export: %s", err);
    printf("exported %s to %s%s\n", from, out, merge ? " (adapters merged into the base)" : "");
    return 0;
}
