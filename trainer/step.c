#include "trainer/step.h"

#include <stddef.h>

double train_step_forward_backward(const TrainBackendOps *ops, void *backend,
                                   const MicroBatches *mb, float loss_scale) {
    ops->zero_grads(backend);
    double sum = 0.0;
    for (int i = 0; i < mb->n_micro; i++) {
        const ModelBatch batch = micro_batch(mb, i);
        sum += ops->forward_backward(backend, &batch, loss_scale);
    }
    return sum;
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
