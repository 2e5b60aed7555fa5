#include "trainer/eval.h"

#include <math.h>
#include <stdlib.h>

#include "common/check.h"
#include "trainer/step.h"

void eval_set_load(EvalSet *eval, const Tokenizer *tok, const char *path, DataOptions opt,
                   int micro_rows) {
    opt.layout = LAYOUT_NPASS;
    packed_dataset_load(tok, path, opt, &eval->data);
    micro_batches_build(&eval->data.rows, micro_rows, &eval->micro);
    eval->losses = xcalloc((size_t)eval->data.rows.n_rows * (size_t)opt.seq_len, sizeof(float));
}

void eval_set_free(EvalSet *eval) {
    micro_batches_free(&eval->micro);
    packed_dataset_free(&eval->data);
    free(eval->losses);
}

void evaluate(const TrainBackendOps *ops, void *backend, EvalSet *eval, double *eval_loss,
              double *eval_answer_loss) {
    const PackedRows *rows = &eval->data.rows;
    train_step_forward(ops, backend, &eval->micro, eval->losses);
    double all = 0, answer = 0;
    long long n_all = 0, n_answer = 0;
    for (int r = 0; r < rows->n_rows; r++) {
        for (int i = 0; i + 1 < rows->seq_len; i++) {
            size_t slot = (size_t)r * (size_t)rows->seq_len + (size_t)i;
            if (rows->target[slot] == -1) continue;
            all += eval->losses[slot];
            n_all++;
            if (rows->role[slot + 1] == ROLE_ANSWER) {
                answer += eval->losses[slot];
                n_answer++;
            }
        }
    }
    *eval_loss = n_all ? all / (double)n_all : NAN;
    *eval_answer_loss = n_answer ? answer / (double)n_answer : NAN;
}
