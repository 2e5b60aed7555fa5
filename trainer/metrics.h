// Per-step metrics: one JSON object per line in <out_dir>/metrics.jsonl, and a
// console line (step, loss, lr, grad norm, tokens/s, MFU, ETA).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include "model/model.h"

typedef struct {
    long step;                 // 1-based: optimizer steps completed
    double loss;               // mean CE over the step's trained tokens
    double lr, grad_norm;      // grad_norm before clipping
    long long tokens;          // non-padding tokens processed this step
    long long trained_tokens;  // targets this step
    int conversations;         // samples this step
    double tokens_per_s;       // this step
    double npass_equivalent_tokens_per_s;  // the tokens npass lays out for this step's
                                           // conversations, per second of this step
    double elapsed_s;          // training time since the run started (across resumes)
    double mfu;                // per rank: model FLOPs/s over the peak; < 0: no peak given
    int world_size;            // ranks training the step (0 or 1: one; tokens_per_s is theirs)
    double device_memory_gib;  // GPU memory in use (cudaMemGetInfo); 0: not on a GPU (omitted)
    bool has_eval;
    double eval_loss, eval_answer_loss;
    bool has_accuracy;         // multi-turn accuracy on eval.generate_conversations (NAN: no turn)
    double eval_accuracy, eval_later_turn_accuracy;
    double epoch;              // passes over the training data done (epoch + position)
} StepMetrics;

typedef struct {
    FILE *f;
    char *path;
    long good_bytes;         // the file's length after the last complete line
    bool failed;             // a write has failed
    int failures_reported;   // 0 or 1: a failure is reported once
} MetricsLog;

// Opens <out_dir>/metrics.jsonl. On a resume from step `resume_step` > 0 the file keeps
// only its lines with step <= resume_step, so a resumed run's file reads like an
// uninterrupted one; otherwise it starts empty. Either way the file is first written
// whole through common/output_file.h (atomically). Returns 0, or -1 with a message.
int metrics_open(MetricsLog *log, const char *out_dir, long resume_step, char *err,
                 size_t err_len);
// One line, flushed. A failed write (full disk) is reported once on stderr, the partial
// line is cut off (the file stays valid JSONL) and training goes on.
void metrics_write(MetricsLog *log, const StepMetrics *m);
void metrics_close(MetricsLog *log);

// "step 12/200 | loss 3.1416 | lr 3.00e-03 | gnorm 0.812 | 51234 tok/s | 80123 npass-eq tok/s
// | MFU n/a | ETA 1m02s"
// (then " | 2 ranks" with several, " | GPU mem 1.23 GiB" on a GPU, the eval losses on
// eval steps, and last " | epoch 0.53"). metrics.jsonl has "world_size" with several ranks.
void metrics_print_console(FILE *f, const StepMetrics *m, long total_steps, double eta_s);

// Weights that run through a matmul per token: all 2-D tensors but the embedding
// lookup, plus the LM head when it is tied to the embedding.
long long model_matmul_params(const ParamTable *table, const ModelConfig *mc);

// Model FLOPs per trained-or-not token for forward+backward: 6 x (matmul weights),
// counting the LM head even when tied; attention scores (~12 x layers x hidden x context)
// are left out, so this undercounts long contexts slightly.
double model_flops_per_token(long long n_matmul_params);
