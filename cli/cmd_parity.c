// `train parity --config FILE [--set k=v]... --json out.json`: the layouts' loss and
// gradient parity against npass (trainer/parity.h), as a table and as JSON.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/check.h"
#include "common/output_file.h"
#include "trainer/parity.h"
#include "trainer/setup.h"

int cmd_parity(int argc, char **argv) {
    const char *json_path = NULL;
    RunConfig *c = config_from_args(argc, argv, "parity", "--json", &json_path);
    if (!json_path)
        fatal("train parity: --json out.json is required (usage: train parity --config FILE "
              "[--set key=value]... --json out.json)");
    json_t *report = parity_report(c);
    parity_print(report, stdout);
    {
        char *text = json_dumps(report, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        char err[1024];
        if (!text || write_file_atomic(json_path, text, strlen(text), err, sizeof err) != 0)
            fatal("--json %s", text ? err : "cannot format the report");
        free(text);
        printf("wrote %s\n", json_path);
    }
    json_decref(report);
    config_free(c);
    return 0;
}
