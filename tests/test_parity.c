// `train parity` on a tiny model: duplicate (conversations) and shared_prefix
// (shared-prefix sets) must match npass within 1e-5 (loss) and 1e-4 (every tensor's
// gradient); mask_only must differ clearly, which shows the comparison can fail.
#include <string.h>

#include "test_util.h"
#include "trainer/parity.h"

static const char *tiny[] = {
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2",
    "model.num_attention_heads=4", "model.num_key_value_heads=2", "data.seq_len=2048",
    "parity.conversations=4", "train.micro_rows=2", "seed=7",
};
enum { N_TINY = sizeof tiny / sizeof tiny[0] };

static json_t *report_for(const char *train_path) {
    char *overrides[N_TINY + 1];
    for (int i = 0; i < N_TINY; i++) overrides[i] = (char *)tiny[i];
    char path_override[256];
    snprintf(path_override, sizeof path_override, "data.train_path=%s", train_path);
    overrides[N_TINY] = path_override;
    RunConfig *c = config_load(NULL, N_TINY + 1, overrides);
    json_t *report = parity_report(c);
    config_free(c);
    parity_print(report, stdout);
    return report;
}

static void check_exact(const json_t *layouts, const char *name) {
    const json_t *npass = json_object_get(layouts, "npass");
    const json_t *l = json_object_get(layouts, name);
    EXPECT(l != NULL, "layout %s reported", name);
    if (!l) return;
    EXPECT(json_integer_value(json_object_get(l, "trained_tokens")) ==
              json_integer_value(json_object_get(npass, "trained_tokens")),
          "%s trains the same tokens as npass", name);
    EXPECT(json_integer_value(json_object_get(l, "tokens")) <
              json_integer_value(json_object_get(npass, "tokens")),
          "%s uses fewer tokens than npass", name);
    double loss_diff = json_real_value(json_object_get(l, "loss_rel_diff"));
    EXPECT(loss_diff < 1e-5, "%s loss relative difference %g", name, loss_diff);
    const char *tensor;
    json_t *v;
    int n = 0;
    json_object_foreach((json_t *)json_object_get(l, "grad_rel_diff"), tensor, v) {
        EXPECT(json_real_value(v) < 1e-4, "%s gradient of %s differs by %g", name, tensor,
              json_real_value(v));
        n++;
    }
    EXPECT(n == 2 + 2 * 9, "%s: one entry per tensor (%d)", name, n);  // tied head: embed, norm, 2 x 9
}

int main(void) {
    json_t *conv = report_for("datasets/synthetic/train.jsonl");
    const json_t *layouts = json_object_get(conv, "layouts");
    check_exact(layouts, "duplicate");
    const json_t *mask_only = json_object_get(layouts, "mask_only");
    EXPECT(mask_only != NULL, "mask_only reported");
    double mask_grad = json_real_value(json_object_get(mask_only, "grad_rel_diff_max"));
    EXPECT(mask_grad > 1e-2, "mask_only differs clearly from npass: %g", mask_grad);
    EXPECT(json_real_value(json_object_get(mask_only, "loss_rel_diff")) > 1e-7,
          "mask_only loss differs: %g", json_real_value(json_object_get(mask_only, "loss_rel_diff")));
    json_decref(conv);

    json_t *shared = report_for("datasets/synthetic/shared_prefix.jsonl");
    EXPECT(strcmp(json_string_value(json_object_get(shared, "kind")), "shared_prefix") == 0,
          "shared-prefix file detected");
    check_exact(json_object_get(shared, "layouts"), "shared_prefix");
    json_decref(shared);
    return test_finish();
}
