// Loss/gradient parity of the layouts against npass (cli/cmd_parity.c).
#pragma once
#include <jansson.h>
#include <stdio.h>
#include "trainer/config.h"

// Takes the first parity.conversations samples of data.train_path and runs one
// forward+backward with identical weights (parity.weights, else the seeded init) under
// npass and each other layout that applies: duplicate and mask_only for conversations,
// shared_prefix for shared-prefix sets. Returns (caller json_decref's):
// {"samples": n, "layouts": {"npass": {"loss", "tokens", "trained_tokens"},
//   "<layout>": {..., "loss_rel_diff", "grad_rel_diff_max", "grad_rel_diff_max_tensor",
//                "grad_rel_diff": {tensor: |g - g_npass| / |g_npass|}}}}
json_t *parity_report(const RunConfig *c);

// The report as a table.
void parity_print(const json_t *report, FILE *f);
