// What every backend shares (trainer/backend.h).
#include "trainer/backend.h"

#include <math.h>

const char *param_table_first_nonfinite(const ParamTable *table, const float *values) {
    for (int i = 0; i < table->n_tensors; i++) {
        const ParamTensor *pt = &table->tensors[i];
        for (size_t k = 0; k < pt->numel; k++)
            if (!isfinite(values[pt->offset + k])) return pt->name;
    }
    return NULL;
}
