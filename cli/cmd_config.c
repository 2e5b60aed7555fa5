// `train config [--markdown]`: every config key with its type, default, range, resume rule
// and description (with --markdown, docs/CONFIG.md). `train config --config FILE [--set
// k=v]...` prints the resolved configuration instead, as a run would save it.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/check.h"
#include "trainer/setup.h"

int cmd_config(int argc, char **argv) {
    bool markdown = false;
    int rest = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--markdown") == 0) markdown = true;
        else argv[rest++] = argv[i];
    }
    if (rest == 0) {
        config_describe(stdout, markdown);
        return 0;
    }
    if (markdown) fatal("train config: --markdown lists the keys; it takes no --config or --set");
    RunConfig *c = config_from_args(rest, argv, "config", NULL, NULL);
    char *resolved = config_dump(c);
    puts(resolved);
    free(resolved);
    config_free(c);
    return 0;
}
