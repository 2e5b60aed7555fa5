// `train eval --config FILE [--set k=v]... [--json out.json]`: multi-turn accuracy of
// the model of model.init_from on data.eval_path (trainer/eval.h): every turn of every
// conversation generated from its inference view with the gold history, its answer
// checked; accuracy overall, on the first turn, on later turns and per turn index, with
// the eval loss (inference view, npass) of the same conversations beside it.
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/check.h"
#include "common/output_file.h"
#include "trainer/data_options.h"
#include "trainer/eval.h"
#include "trainer/setup.h"

static void print_report(const AccuracyReport *r, double loss, double answer_loss,
                         double later_loss) {
    printf("accuracy %.4f (%d/%d turns of %d conversations) | first turn %.4f | later turns "
           "%.4f | eval_loss %.4f | eval_answer_loss %.4f | later_turn_answer_loss %.4f\n",
           accuracy_ratio(r->n_correct, r->n_turns), r->n_correct, r->n_turns, r->n_conversations,
           accuracy_ratio(r->first_correct, r->first_n),
           accuracy_ratio(r->later_correct, r->later_n), loss, answer_loss, later_loss);
    printf("| turn | turns | correct | accuracy |\n|---|---|---|---|\n");
    for (int t = 0; t < r->n_indices; t++)
        printf("| %d | %d | %d | %.4f |\n", t + 1, r->per_turn_n[t], r->per_turn_correct[t],
               accuracy_ratio(r->per_turn_correct[t], r->per_turn_n[t]));
    printf("generated %lld tokens (%lld prompt tokens) in %.2f s: %.0f tokens/s\n",
           r->gen.generated_tokens, r->gen.prompt_tokens, r->gen.seconds,
           r->gen.seconds > 0 ? (double)r->gen.generated_tokens / r->gen.seconds : 0.0);
}

int cmd_eval(int argc, char **argv) {
    const char *json_path = NULL;
    RunConfig *c = config_from_args(argc, argv, "eval", "--json", &json_path);
    InferenceModel model;
    inference_model_load(c, "eval", &model);
    printf("%s\n", model.backend_why);
    const char *path = c->data.eval_path;
    if (!path) fatal("train eval: config key 'data.eval_path': a JSONL file is required");
    DataOptions opt = data_options_from_config(c);
    opt.max_samples = 0;  // every conversation, as the accuracy
    double loss, answer_loss, later_loss;
    evaluate_model(&model, path, opt, (int)c->train.micro_rows, &loss, &answer_loss, &later_loss);

    AccuracySet set;
    accuracy_set_load(&set, model.tok, &opt, path, 0);
    if (set.n_shared_prefix)
        printf("%s: %d shared-prefix sets left out (no turns to score)\n", path, set.n_shared_prefix);
    if (set.n_too_long)
        printf("%s: %d turns left out (their prompt is longer than data.seq_len %d)\n", path,
               set.n_too_long, opt.seq_len);
    char why[256];
    const DecodeOps *ops = decode_ops(model.backend, why, sizeof why);
    printf("%s\n", why);
    const GenerateOptions gen = generate_options_from(c, model.tok);
    AccuracyReport report;
    accuracy_evaluate(&set, ops, &model.mc, model.params, &gen, model.tok, &report);
    print_report(&report, loss, answer_loss, later_loss);
    if (json_path) {
        json_t *j = accuracy_report_json(&report);
        json_object_set_new(j, "eval_loss", isfinite(loss) ? json_real(loss) : json_null());
        json_object_set_new(j, "eval_answer_loss",
                            isfinite(answer_loss) ? json_real(answer_loss) : json_null());
        json_object_set_new(j, "later_turn_answer_loss",
                            isfinite(later_loss) ? json_real(later_loss) : json_null());
        json_object_set_new(j, "model", json_string(c->model.init_from));
        json_object_set_new(j, "eval_path", json_string(path));
        char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        char err[1024];
        if (!text || write_file_atomic(json_path, text, strlen(text), err, sizeof err) != 0)
            fatal("--json %s", text ? err : "cannot format the report");
        free(text);
        json_decref(j);
        printf("wrote %s\n", json_path);
    }
    accuracy_report_free(&report);
    accuracy_set_free(&set);
    inference_model_free(&model);
    config_free(c);
    return 0;
}
