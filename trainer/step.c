#include "trainer/step.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "common/check.h"

// comm not NULL: the last micro-batch's backward starts the gradients' sums over the
// ranks as it completes them (the backend's reduce_grads_during_backward, if it has one).
static double micro_batches_forward_backward(const TrainBackendOps *ops, void *backend,
                                             const MicroBatches *mb, float loss_scale,
                                             const DistComm *comm) {
    ops->zero_grads(backend);
    double sum = 0.0;
    for (int i = 0; i < mb->n_micro; i++) {
        const ModelBatch batch = micro_batch(mb, i);
        if (comm && i == mb->n_micro - 1 && ops->reduce_grads_during_backward)
            ops->reduce_grads_during_backward(backend, comm);
        sum += ops->forward_backward(backend, &batch, loss_scale);
    }
    return sum;
}

double train_step_forward_backward(const TrainBackendOps *ops, void *backend,
                                   const MicroBatches *mb, float loss_scale) {
    return micro_batches_forward_backward(ops, backend, mb, loss_scale, NULL);
}

double train_step_forward(const TrainBackendOps *ops, void *backend, const MicroBatches *mb,
                          float *losses) {
    double sum = 0.0;
    for (int i = 0; i < mb->n_micro; i++) {
        const ModelBatch batch = micro_batch(mb, i);
        // Micro-batch i's rows start at row i * micro_rows.
        const size_t offset = (size_t)i * (size_t)mb->micro_rows * (size_t)mb->rows.seq_len;
        sum += ops->forward(backend, &batch, losses ? losses + offset : NULL);
    }
    return sum;
}

int train_step(const TrainBackendOps *ops, void *backend, const MicroBatches *mb,
               long long trained_tokens, const DistComm *comm, const AdamWHyper *h,
               double max_grad_norm, StepOutcome *out, char *err, size_t err_len) {
    const long long step_trained = dist_step_trained_tokens(comm, trained_tokens);
    CHECK(step_trained > 0, "a step of %lld trained tokens", step_trained);
    const double ce_sum = micro_batches_forward_backward(
        ops, backend, mb, (float)(1.0 / (double)step_trained), comm);
    ops->all_reduce_grads(backend, comm);
    out->loss = dist_step_ce_sum(comm, ce_sum) / (double)step_trained;
    if (!isfinite(out->loss))
        return fail(err, err_len, "the loss is %g; stopping without saving this state (the "
                    "last checkpoint, if any, is intact)", out->loss);
    out->grad_norm = ops->grad_norm(backend);
    if (!isfinite(out->grad_norm)) {
        const char *bad = ops->first_nonfinite(backend, true);
        return fail(err, err_len, "non-finite gradient in tensor %s; stopping without saving "
                    "this state (the last checkpoint, if any, is intact)",
                    bad ? bad : "(none: the norm overflowed)");
    }
    ops->optimizer_step(backend, h, out->grad_norm, max_grad_norm);
    const char *bad_weight = ops->first_nonfinite(backend, false);
    if (bad_weight)
        return fail(err, err_len, "the update made weights of tensor %s non-finite; stopping "
                    "without saving this state (the last checkpoint, if any, is intact)",
                    bad_weight);
    return 0;
}

void bucket_plan_build(const ParamTable *table, size_t bucket_bytes, BucketPlan *out) {
    size_t *numel = xmalloc(((size_t)table->n_tensors + 1) * sizeof *numel), next = 0;
    for (int t = 0; t < table->n_tensors; t++) {
        CHECK(table->tensors[t].offset == next, "tensor %s does not follow the one before it",
              table->tensors[t].name);
        numel[t] = table->tensors[t].numel;
        next += numel[t];
    }
    CHECK(next == table->total, "the tensors cover %zu of %zu elements", next, table->total);
    bucket_plan_from_sizes(numel, table->n_tensors, bucket_bytes, out);
    free(numel);
}
