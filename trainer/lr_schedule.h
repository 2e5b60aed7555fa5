// The learning-rate schedule: linear warm-up, then cosine decay to lr * min_lr_ratio.
#pragma once

// Learning rate for 0-based step `step` of `total_steps`: linear warm-up
// lr * (step+1)/warmup over the first `warmup` steps, then cosine from lr down to
// lr * min_lr_ratio, reached exactly at the last step.
double lr_schedule(long step, long total_steps, long warmup, double lr, double min_lr_ratio);
