#include "trainer/lr_schedule.h"

#include <math.h>

double lr_schedule(long step, long total_steps, long warmup, double lr, double min_lr_ratio) {
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    const long decay_steps = total_steps - warmup - 1;
    if (decay_steps <= 0) return lr;
    double progress = (double)(step - warmup) / (double)decay_steps;
    if (progress > 1.0) progress = 1.0;
    const double min_lr = lr * min_lr_ratio;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
}
