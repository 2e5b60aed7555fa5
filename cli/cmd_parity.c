// `train parity --config FILE [--set k=v]... --json out.json`: the layouts' loss and
// gradient parity against npass (trainer/parity.h), as a table and as JSON.
#include <jansson.h>
#include <stdio.h>

#include "cli/commands.h"
#include "common/check.h"
#include "trainer/parity.h"
#include "trainer/setup.h"

int cmd_parity(int argc, char **argv) {
    const char *json_path = NULL;
    Config *c = config_from_args(argc, argv, "parity", "--json", &json_path);
    json_t *report = parity_report(c);
    parity_print(report, stdout);
    if (json_path) {
        if (json_dump_file(report, json_path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
            fatal("--json %s: cannot write", json_path);
        printf("wrote %s\n", json_path);
    }
    json_decref(report);
    config_free(c);
    return 0;
}
