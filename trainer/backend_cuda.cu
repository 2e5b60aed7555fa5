// The CUDA training backend: one allocation each for the bf16 weights the model runs on,
// the low halves that make them the fp32 master weights (trainer/split_float.h: 2 bytes
// per parameter instead of a 4-byte master copy), the fp32 gradients, and the optimizer
// state (AdamW m | AdamW v | two scalars); the model's activation arena is allocated once
// by cuda_model_create.
// A step allocates nothing: the attention backward's scratch is a workspace in that
// arena. Under LoRA (BackendSetup.lora) the table, and so all of the above, is the
// adapters'; the frozen base is one more allocation of bf16 weights alone (2 bytes a
// parameter, no gradients, no moments) and the model computes no gradient for it.
// With train.offload_optimizer the fp32 master weights and m, v live in pinned host
// memory instead (the run's own state arrays when it hands them over:
// BackendSetup.host_params), beside rings the gradients come down into and the updated
// bf16 weights go up from; the device keeps the bf16 weights, the gradients and the two
// norms, and AdamW runs on the host on a worker thread (trainer/offload_pipeline.h)
// behind the next forward (offload_step; docs/DESIGN.md, the offloaded optimizer).
#include "trainer/backend_cuda.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/check.h"
#include "common/cuda_check.h"
#include "model/model_cuda.h"
#include "model/ops_cuda.h"
extern "C" {  // plain C headers
#include "trainer/device_memory.h"
#include "trainer/offload_pipeline.h"
}
#include "trainer/split_float.h"

struct CudaTrainer {
    const ParamTable *table;
    size_t n;                  // table->total
    CudaModel *model;
    cudaStream_t stream;       // the model's: every kernel runs on it, in order
    __nv_bfloat16 *weights;    // [n] what the model runs on: the master's high halves
    uint16_t *master_lo;       // [n] the master's low halves (trainer/split_float.h); offload: NULL
    float *grads;              // [n] fp32
    float *optimizer;          // [2n + 2]: m | v | grad norm | weight norm
    float *grad_norm, *weight_norm;
    AdamWState adamw;          // m, v: device, in optimizer; step: updates applied
    float *host_scalar;        // [1] pinned: a norm read back
    const DistComm *reducing;  // the comm the backward hands its final gradients to, or NULL
    __nv_bfloat16 *base;       // LoRA: [base table total] the frozen base weights; else NULL
    // train.offload_optimizer: host_params (the fp32 master), adamw.m, adamw.v are pinned
    // host memory (the caller's when owns_host_state is false), with host_grads and
    // host_hi, rings of OFFLOAD_SLOTS chunks (gradients down, bf16 weights up); downloads
    // on down_stream after backward_done, uploads on copy_stream, both queued by the
    // pipeline's worker thread (the stage_* functions), which also runs AdamW. While an
    // update runs (offload_pipeline_running), the worker owns host_params, adamw (m, v;
    // step, hyper and clip_scale are only read), the rings and the events down[] and
    // up[]; every other thread reads them only after offload_finish, or a chunk's up[]
    // event after offload_pipeline_wait_uploaded.
    bool offload, owns_host_state;
    float *host_params;  // [n]
    uint16_t *host_hi;   // [OFFLOAD_SLOTS x OFFLOAD_CHUNK] at most n
    float *host_grads;   // [OFFLOAD_SLOTS x OFFLOAD_CHUNK] at most n
    cudaStream_t copy_stream, down_stream;
    cudaEvent_t backward_done;
    cudaEvent_t *down, *up;  // [n_chunks]: a chunk's gradients down, its weights up
    int n_chunks;
    OffloadPipeline *pipeline;
    AdamWHyper hyper;  // the running update's
    float clip_scale;
    // The model's stream is ordered after the uploads of chunks [0, waited) of the latest
    // update (it waited for up[waited - 1]: copy_stream runs them in order); n_chunks:
    // after all of them.
    int waited;
    // The latest update zeroes the gradients (each chunk's on down_stream after its
    // download) and nothing has written them since: zero_grads has nothing to do.
    bool grads_zeroed;
    bool finite;  // every master weight finite (offload: known from set_state and the update)
};

// The offloaded update's unit: gradients come down, AdamW runs and the weights go up a
// chunk at a time, so the copies overlap the host's arithmetic.
static const size_t OFFLOAD_CHUNK = CUDA_OFFLOAD_CHUNK;
static const int OFFLOAD_SLOTS = CUDA_OFFLOAD_SLOTS;  // chunk c uses slot c % OFFLOAD_SLOTS

// ops_cuda_init's process-wide scratch, shared by every live trainer.
static int g_live_trainers, g_ops_tokens, g_ops_channels;
// The device the trainers run on (a rank's: NCCL selected it), for host allocations on
// other threads, which start on device 0 (each rank would make a context there); -1
// before the first trainer: an allocation then (the run's pinned state) is the calling
// thread's, on the device it selected.
static int g_device = -1;

static void ops_acquire(int tokens, int channels) {
    CHECK(g_live_trainers == 0 || (tokens <= g_ops_tokens && channels <= g_ops_channels),
          "a CUDA trainer for %d tokens x %d channels cannot coexist with one made for %d x %d "
          "(the ops' scratch is process-wide)", tokens, channels, g_ops_tokens, g_ops_channels);
    if (g_live_trainers++ > 0) return;
    ops_cuda_init(tokens, channels);
    g_ops_tokens = tokens;
    g_ops_channels = channels;
}

static void ops_release(void) {
    if (--g_live_trainers == 0) ops_cuda_destroy();
}

int cuda_device_count(char *name, size_t name_len) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // no driver or no device: not an error here
        return 0;
    }
    cudaDeviceProp prop;
    if (n > 0 && name_len > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        snprintf(name, name_len, "%s", prop.name);
    return n;
}

static float *read_scalar(CudaTrainer *t, const float *device_scalar) {
    cudaCheck(cudaMemcpyAsync(t->host_scalar, device_scalar, sizeof(float),
                              cudaMemcpyDeviceToHost, t->stream));
    cudaCheck(cudaStreamSynchronize(t->stream));
    return t->host_scalar;
}

// ---------------------------------------------------------------- the offloaded update
// The pipeline's stages (trainer/offload_pipeline.h), on its worker thread, one update
// at a time, chunk by chunk in order. Chunk c is elements [c * OFFLOAD_CHUNK, + k).

static size_t chunk_elements(const CudaTrainer *t, int c) {
    const size_t from = (size_t)c * OFFLOAD_CHUNK;
    return t->n - from < OFFLOAD_CHUNK ? t->n - from : OFFLOAD_CHUNK;
}

static void stage_thread_init(void *ctx) {
    (void)ctx;
    cudaCheck(cudaSetDevice(g_device));  // a new thread starts on device 0
}

// Chunk c's gradients down into ring slot `slot` on down_stream (which waits for the
// backward: offload_step), then the chunk's gradients zeroed there (the next backward
// adds into zeros; zero_grads), then down[c]. The pipeline queues a slot's next chunk
// only after the update that read it returned.
static void stage_download(void *ctx, int c, int slot) {
    CudaTrainer *t = (CudaTrainer *)ctx;
    const size_t from = (size_t)c * OFFLOAD_CHUNK, k = chunk_elements(t, c);
    cudaCheck(cudaMemcpyAsync(t->host_grads + (size_t)slot * OFFLOAD_CHUNK, t->grads + from,
                              k * sizeof(float), cudaMemcpyDeviceToHost, t->down_stream));
    cudaCheck(cudaMemsetAsync(t->grads + from, 0, k * sizeof(float), t->down_stream));
    cudaCheck(cudaEventRecord(t->down[c], t->down_stream));
}

static void stage_wait_download(void *ctx, int c) {
    CudaTrainer *t = (CudaTrainer *)ctx;
    cudaCheck(cudaEventSynchronize(t->down[c]));
}

// AdamW on the host's cores (OpenMP), with the clipping scale from the device norm, the
// bf16 weights into the slot's part of host_hi. That slot was last read by the upload
// of chunk c - OFFLOAD_SLOTS, waited for here; the previous update's uploads had all
// landed before this update started (offload_step read the norm after the stream waited
// for them).
static bool stage_update(void *ctx, int c, int slot) {
    CudaTrainer *t = (CudaTrainer *)ctx;
    const size_t from = (size_t)c * OFFLOAD_CHUNK;
    if (c >= OFFLOAD_SLOTS) cudaCheck(cudaEventSynchronize(t->up[c - OFFLOAD_SLOTS]));
    return adamw_master_range_cpu(&t->adamw, t->table, &t->hyper, from,
                                  from + chunk_elements(t, c), t->host_params,
                                  t->host_hi + (size_t)slot * OFFLOAD_CHUNK,
                                  t->host_grads + (size_t)slot * OFFLOAD_CHUNK, t->clip_scale);
}

// The chunk's bf16 weights up on copy_stream, then up[c]. copy_stream runs the uploads
// in chunk order, so up[c] complete means chunks [0, c] are up; and each upload is
// queued after its chunk's download (and gradient zeroing) completed on the host's
// clock, so up[c] complete also means the gradients of chunks [0, c] are down and zero.
static void stage_upload(void *ctx, int c) {
    CudaTrainer *t = (CudaTrainer *)ctx;
    const size_t from = (size_t)c * OFFLOAD_CHUNK;
    cudaCheck(cudaMemcpyAsync(t->weights + from,
                              t->host_hi + (size_t)(c % OFFLOAD_SLOTS) * OFFLOAD_CHUNK,
                              chunk_elements(t, c) * sizeof(uint16_t), cudaMemcpyHostToDevice,
                              t->copy_stream));
    cudaCheck(cudaEventRecord(t->up[c], t->copy_stream));
}

// Waits (on the host) for a running update to finish. Its weights are checked here:
// train_step's check after optimizer_step cannot see an update that has not run yet,
// so an update that made a weight non-finite stops the process at the first call that
// waits for it (the forward that would read it, get_state before a checkpoint, ...),
// before anything uses or saves that state.
static void offload_finish(CudaTrainer *t) {
    if (!offload_pipeline_running(t->pipeline)) return;
    t->finite = offload_pipeline_finish(t->pipeline);
    if (t->finite) return;
    const char *name = param_table_first_nonfinite(t->table, t->host_params);
    fatal("the offloaded AdamW update of optimizer step %ld made weights of tensor %s "
          "non-finite; stopping without saving this state (the last checkpoint, if any, is "
          "intact)", t->adamw.step, name ? name : "(none found)");
}

// Orders the model's stream after the latest update's uploads of chunks [0, k): waits
// (on the host) until the worker has queued them, then the stream waits for up[k - 1]
// (the upload queue is in order). The host wait is what makes the event wait correct:
// the event is waited for only once this update has recorded it, never an earlier
// update's record of it. The uploads come from one update at a time, and a new one
// starts only after the stream waited for all of the previous one's (offload_step).
static void order_after_uploads(CudaTrainer *t, int k) {
    if (k > t->n_chunks) k = t->n_chunks;
    if (k <= t->waited) return;
    if (!offload_pipeline_wait_uploaded(t->pipeline, k)) offload_finish(t);  // fatal
    cudaCheck(cudaStreamWaitEvent(t->stream, t->up[k - 1], 0));
    t->waited = k;
}

// The model's forward is about to read weights [from, to): the stream waits for the
// chunks up to the one holding to - 1 (the forward asks in table order, so a layer
// waits for its own chunks; earlier chunks were waited for already).
static void weights_ready(void *ctx, size_t from, size_t to, cudaStream_t stream) {
    CudaTrainer *t = (CudaTrainer *)ctx;
    (void)from;
    CHECK(stream == t->stream, "weights_ready: another stream than the trainer's model's");
    if (to > 0) order_after_uploads(t, (int)((to - 1) / OFFLOAD_CHUNK) + 1);
}

static void *cuda_create(const BackendSetup *setup) {
    // Refused up front, naming the keys, rather than "out of memory" midway.
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    const CudaMemoryRequest request = {setup->mc, setup->micro_rows, setup->seq_len,
                                       setup->recompute, cuda_model_attention_workspace_bytes,
                                       setup->lora ? &setup->lora->cfg : nullptr,
                                       setup->offload_optimizer, setup->offload_activations};
    char err[2048];
    if (cuda_memory_check(&request, free_bytes, total_bytes, nullptr, err, sizeof err) != 0)
        fatal("%s", err);
    // The caller's state arrays, counted in the estimates, are taken already.
    CHECK(!setup->host_params || (setup->offload_optimizer && !setup->lora && setup->host_m &&
                                  setup->host_v),
          "cuda backend: host state arrays are for the offloaded optimizer of full fine-tuning");
    const size_t host_available =
        host_memory_available() + (setup->host_params ? host_state_bytes(setup->table->total) : 0);
    if (setup->offload_optimizer &&
        cuda_offload_host_check(setup->mc, host_available, err, sizeof err) != 0)
        fatal("%s", err);
    if (cuda_activations_host_check(&request, host_available, err, sizeof err) != 0)
        fatal("%s", err);
    cudaCheck(cudaGetDevice(&g_device));
    CudaTrainer *t = (CudaTrainer *)xcalloc(1, sizeof *t);
    t->table = setup->table;
    t->n = setup->table->total;
    // The ops' rows are hidden_size wide, and head_dim wide for the q/k norms.
    const int head_dim = model_dims(setup->mc).head_dim;
    const int channels = setup->mc->qk_norm && head_dim > setup->mc->hidden_size
                             ? head_dim : setup->mc->hidden_size;
    ops_acquire(setup->micro_rows * setup->seq_len, channels);
    t->model = cuda_model_create_offload(setup->mc, setup->micro_rows, setup->seq_len,
                                         setup->recompute, setup->offload_activations);
    cuda_model_set_deterministic(t->model, setup->deterministic);
    t->stream = cuda_model_stream(t->model);
    cudaCheck(cudaMalloc(&t->weights, t->n * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc(&t->grads, t->n * sizeof(float)));
    t->adamw.n = t->n;
    t->offload = setup->offload_optimizer;
    if (t->offload) {
        cudaCheck(cudaMalloc(&t->optimizer, 2 * sizeof(float)));
        t->grad_norm = t->optimizer;
        t->owns_host_state = !setup->host_params;
        if (t->owns_host_state) {
            cudaCheck(cudaMallocHost(&t->host_params, t->n * sizeof(float)));
            cudaCheck(cudaMallocHost(&t->adamw.m, t->n * sizeof(float)));
            cudaCheck(cudaMallocHost(&t->adamw.v, t->n * sizeof(float)));
        } else {
            t->host_params = setup->host_params;
            t->adamw.m = setup->host_m;
            t->adamw.v = setup->host_v;
        }
        const size_t ring = cuda_offload_ring_elements(t->n);
        cudaCheck(cudaMallocHost(&t->host_grads, ring * sizeof(float)));
        cudaCheck(cudaMallocHost(&t->host_hi, ring * sizeof(uint16_t)));
        cudaCheck(cudaStreamCreateWithFlags(&t->copy_stream, cudaStreamNonBlocking));
        cudaCheck(cudaStreamCreateWithFlags(&t->down_stream, cudaStreamNonBlocking));
        cudaCheck(cudaEventCreateWithFlags(&t->backward_done, cudaEventDisableTiming));
        t->n_chunks = (int)((t->n + OFFLOAD_CHUNK - 1) / OFFLOAD_CHUNK);
        t->down = (cudaEvent_t *)xmalloc(2 * (size_t)t->n_chunks * sizeof(cudaEvent_t));
        t->up = t->down + t->n_chunks;
        for (int c = 0; c < 2 * t->n_chunks; c++)
            cudaCheck(cudaEventCreateWithFlags(&t->down[c], cudaEventDisableTiming));
        t->waited = t->n_chunks;
        const OffloadStages stages = {t, stage_download, stage_wait_download, stage_update,
                                      stage_upload, stage_thread_init};
        t->pipeline = offload_pipeline_create(t->n_chunks, OFFLOAD_SLOTS, &stages);
        cuda_model_set_weights_ready(t->model, weights_ready, t);
    } else {
        cudaCheck(cudaMalloc(&t->master_lo, t->n * sizeof(uint16_t)));
        cudaCheck(cudaMalloc(&t->optimizer, (2 * t->n + 2) * sizeof(float)));
        t->adamw.m = t->optimizer;
        t->adamw.v = t->optimizer + t->n;
        t->grad_norm = t->optimizer + 2 * t->n;
    }
    t->weight_norm = t->grad_norm + 1;
    cudaCheck(cudaMallocHost(&t->host_scalar, sizeof(float)));
    if (setup->lora) {  // the base in bf16, rounded on the host a chunk at a time
        CHECK(setup->table->total == setup->lora->table.total && setup->base_params,
              "cuda backend: the LoRA table is not the trainable table, or no base weights");
        const size_t n = setup->base_table->total;
        cudaCheck(cudaMalloc(&t->base, n * sizeof(__nv_bfloat16)));
        const size_t step = (size_t)1 << 22;
        uint16_t *chunk = (uint16_t *)xmalloc(step * sizeof(uint16_t));
        for (size_t at = 0; at < n; at += step) {
            const size_t k = n - at < step ? n - at : step;
            for (size_t i = 0; i < k; i++) {  // the high half: bf16 as the master's weights
                uint32_t bits;
                memcpy(&bits, &setup->base_params[at + i], sizeof bits);
                chunk[i] = split_float_hi(bits);
            }
            cudaCheck(cudaMemcpy(t->base + at, chunk, k * sizeof(uint16_t),
                                 cudaMemcpyHostToDevice));
        }
        free(chunk);
        cuda_model_set_lora(t->model, setup->lora, t->weights, t->grads);
    }
    return t;
}

static void cuda_destroy(void *state) {
    CudaTrainer *t = (CudaTrainer *)state;
    if (t->offload) {
        // No stage runs after this, every download has landed (the worker waited for
        // each); the uploads may still write the weights.
        offload_pipeline_destroy(t->pipeline);
        cudaCheck(cudaStreamSynchronize(t->copy_stream));
    }
    cuda_model_free(t->model);  // waits for the stream
    cudaCheck(cudaFree(t->weights));
    if (t->base) cudaCheck(cudaFree(t->base));
    if (t->offload) {
        for (int c = 0; c < 2 * t->n_chunks; c++) cudaCheck(cudaEventDestroy(t->down[c]));
        free(t->down);
        cudaCheck(cudaStreamDestroy(t->copy_stream));
        cudaCheck(cudaStreamDestroy(t->down_stream));
        cudaCheck(cudaEventDestroy(t->backward_done));
        if (t->owns_host_state) {
            cudaCheck(cudaFreeHost(t->host_params));
            cudaCheck(cudaFreeHost(t->adamw.m));
            cudaCheck(cudaFreeHost(t->adamw.v));
        }
        cudaCheck(cudaFreeHost(t->host_hi));
        cudaCheck(cudaFreeHost(t->host_grads));
    } else {
        cudaCheck(cudaFree(t->master_lo));
    }
    cudaCheck(cudaFree(t->grads));
    cudaCheck(cudaFree(t->optimizer));
    cudaCheck(cudaFreeHost(t->host_scalar));
    ops_release();
    free(t);
}

// The master weights between host fp32 params and the device halves, split or joined
// on the host a chunk at a time: no fp32 copy of them on the device. kind is the
// direction; params is only read when it is cudaMemcpyHostToDevice.
static const size_t MASTER_CHUNK = (size_t)1 << 22;  // elements per chunk: 16 MiB of halves

static void transfer_master(CudaTrainer *t, float *params, cudaMemcpyKind kind) {
    const bool up = kind == cudaMemcpyHostToDevice;
    uint16_t *hi = (uint16_t *)xmalloc(2 * MASTER_CHUNK * sizeof(uint16_t));  // hi | lo
    uint16_t *lo = hi + MASTER_CHUNK;
    for (size_t at = 0; at < t->n; at += MASTER_CHUNK) {
        const size_t k = t->n - at < MASTER_CHUNK ? t->n - at : MASTER_CHUNK;
        void *device_hi = t->weights + at, *device_lo = t->master_lo + at;
        if (up) split_floats(params + at, k, hi, lo);
        cudaCheck(cudaMemcpyAsync(up ? device_hi : hi, up ? hi : device_hi, k * sizeof *hi, kind,
                                  t->stream));
        cudaCheck(cudaMemcpyAsync(up ? device_lo : lo, up ? lo : device_lo, k * sizeof *lo, kind,
                                  t->stream));
        cudaCheck(cudaStreamSynchronize(t->stream));  // before the chunk is reused
        if (!up) join_floats(hi, lo, k, params + at);
    }
    free(hi);
}

// Host arrays into the offloaded state's, unless they are the same arrays (the run's
// own, handed over at create).
static void copy_unless_same(float *to, const float *from, size_t n) {
    if (to != from) memcpy(to, from, n * sizeof(float));
}

// The offloaded master weights are the host's fp32; set_state sends their high halves up
// a chunk at a time through host_hi (after a running update, whose uploads it replaces).
static void offload_set_state(CudaTrainer *t, const float *params, const AdamWState *opt) {
    offload_finish(t);
    cudaCheck(cudaStreamSynchronize(t->copy_stream));  // no upload still reads host_hi
    cudaCheck(cudaStreamSynchronize(t->stream));
    t->waited = t->n_chunks;  // every upload is complete
    copy_unless_same(t->host_params, params, t->n);
    copy_unless_same(t->adamw.m, opt->m, t->n);
    copy_unless_same(t->adamw.v, opt->v, t->n);
    t->finite = param_table_first_nonfinite(t->table, t->host_params) == NULL;
    for (int c = 0; c < t->n_chunks; c++) {
        const size_t from = (size_t)c * OFFLOAD_CHUNK, k = chunk_elements(t, c);
        for (size_t i = 0; i < k; i++) {
            uint32_t bits;
            memcpy(&bits, &t->host_params[from + i], sizeof bits);
            t->host_hi[i] = split_float_hi(bits);
        }
        cudaCheck(cudaMemcpyAsync(t->weights + from, t->host_hi, k * sizeof(uint16_t),
                                  cudaMemcpyHostToDevice, t->stream));
        cudaCheck(cudaStreamSynchronize(t->stream));  // before host_hi is refilled
    }
    t->adamw.step = opt->step;
}

static void cuda_set_state(void *state, const float *params, const AdamWState *opt) {
    CudaTrainer *t = (CudaTrainer *)state;
    CHECK(opt->n == t->n, "optimizer state has %zu elements, model %zu", opt->n, t->n);
    if (t->offload) return offload_set_state(t, params, opt);
    const size_t bytes = t->n * sizeof(float);
    transfer_master(t, (float *)params, cudaMemcpyHostToDevice);
    cudaCheck(cudaMemcpyAsync(t->adamw.m, opt->m, bytes, cudaMemcpyHostToDevice, t->stream));
    cudaCheck(cudaMemcpyAsync(t->adamw.v, opt->v, bytes, cudaMemcpyHostToDevice, t->stream));
    cudaCheck(cudaStreamSynchronize(t->stream));
    t->adamw.step = opt->step;
}

static void cuda_get_state(void *state, float *params, AdamWState *opt) {
    CudaTrainer *t = (CudaTrainer *)state;
    if (t->offload) {  // the host master is what went up last
        offload_finish(t);
        copy_unless_same(params, t->host_params, t->n);
        copy_unless_same(opt->m, t->adamw.m, t->n);
        copy_unless_same(opt->v, t->adamw.v, t->n);
        opt->step = t->adamw.step;
        return;
    }
    const size_t bytes = t->n * sizeof(float);
    transfer_master(t, params, cudaMemcpyDeviceToHost);
    cudaCheck(cudaMemcpyAsync(opt->m, t->adamw.m, bytes, cudaMemcpyDeviceToHost, t->stream));
    cudaCheck(cudaMemcpyAsync(opt->v, t->adamw.v, bytes, cudaMemcpyDeviceToHost, t->stream));
    cudaCheck(cudaStreamSynchronize(t->stream));
    opt->step = t->adamw.step;
}

// Offloaded: after an update, its downloads have zeroed the gradients (or will have,
// once the stream is ordered after its uploads: the next forward's waits or
// order_after_uploads, before anything reads or writes them).
static void cuda_zero_grads(void *state) {
    CudaTrainer *t = (CudaTrainer *)state;
    if (t->offload && t->grads_zeroed) return;
    cudaCheck(cudaMemsetAsync(t->grads, 0, t->n * sizeof(float), t->stream));
}

// Under LoRA the model runs on the frozen base with the adapters bound at create.
static double cuda_forward_backward(void *state, const ModelBatch *batch, float loss_scale) {
    CudaTrainer *t = (CudaTrainer *)state;
    if (t->base) return cuda_model_forward_backward(t->model, t->base, nullptr, batch, loss_scale);
    if (!t->offload)
        return cuda_model_forward_backward(t->model, t->weights, t->grads, batch, loss_scale);
    // Offloaded: the forward's weights_ready calls cover the table, so the stream waits
    // for every chunk's upload (and gradient zeroing) before the loss head and the
    // backward add into the gradients.
    t->grads_zeroed = false;
    const double loss =
        cuda_model_forward_backward(t->model, t->weights, t->grads, batch, loss_scale);
    CHECK(t->waited == t->n_chunks, "the forward waited for %d of %d offloaded chunks",
          t->waited, t->n_chunks);
    return loss;
}

static double cuda_forward(void *state, const ModelBatch *batch, float *losses) {
    CudaTrainer *t = (CudaTrainer *)state;
    return cuda_model_forward(t->model, t->base ? t->base : t->weights, batch, losses);
}

static void check_device_comm(const DistComm *comm) {
    CHECK(comm->device || comm->world_size == 1,
          "the cuda backend's gradients are in device memory: a %d-rank host communicator "
          "cannot sum them", comm->world_size);
}

// With NCCL's communicator: the bucketed all-reduce, ordered on the model's stream; the
// buckets the backward already started (cuda_reduce_grads_during_backward) are not
// started again.
static void cuda_all_reduce_grads(void *state, const DistComm *comm) {
    CudaTrainer *t = (CudaTrainer *)state;
    check_device_comm(comm);
    CHECK(!t->reducing || t->reducing == comm, "all_reduce_grads: another comm's sums are running");
    if (t->offload) order_after_uploads(t, t->n_chunks);
    comm->sum_floats(comm, t->grads, t->n, t->stream);
    cuda_model_set_grads_ready(t->model, NULL, NULL);
    t->reducing = NULL;
}

static void grads_ready(void *ctx, size_t from, cudaStream_t stream) {
    CudaTrainer *t = (CudaTrainer *)ctx;
    t->reducing->sum_floats_ready(t->reducing, t->grads, from, stream);
}

static void cuda_reduce_grads_during_backward(void *state, const DistComm *comm) {
    CudaTrainer *t = (CudaTrainer *)state;
    check_device_comm(comm);
    // Under LoRA the backward names no part of the adapters' gradients: all at the end.
    if (!comm->sum_floats_ready || t->base) return;
    t->reducing = comm;
    cuda_model_set_grads_ready(t->model, grads_ready, t);
}

static void cuda_get_grads(void *state, float *grads) {
    CudaTrainer *t = (CudaTrainer *)state;
    if (t->offload) order_after_uploads(t, t->n_chunks);
    cudaCheck(cudaMemcpyAsync(grads, t->grads, t->n * sizeof(float), cudaMemcpyDeviceToHost,
                              t->stream));
    cudaCheck(cudaStreamSynchronize(t->stream));
}

static double cuda_grad_norm(void *state) {
    CudaTrainer *t = (CudaTrainer *)state;
    if (t->offload) order_after_uploads(t, t->n_chunks);
    grad_global_norm_cuda(t->grad_norm, t->grads, t->n, t->stream);
    return *read_scalar(t, t->grad_norm);
}

// The offloaded update, after the backward (and the all-reduce) on t->stream, started
// here and run on the pipeline's worker thread (trainer/offload_pipeline.h, the stage_*
// functions): the chunks' gradients go down on down_stream into a ring of two slots;
// the worker waits for a chunk's, runs AdamW on it (adamw_master_range_cpu, OpenMP),
// queues the chunk after next into the slot it freed and the chunk's bf16 weights up on
// copy_stream. This returns at once: the next forward waits per layer for its chunks
// (weights_ready), and whatever reads the state on the host waits for the whole update
// (offload_finish). The clipping scale is the CUDA kernel's, from the device norm that
// grad_norm left in t->grad_norm.
static void offload_step(CudaTrainer *t, const AdamWHyper *h, float max_grad_norm) {
    // The previous update (a step without a forward since): finished, and the stream
    // after its uploads, so that none still reads host_hi when this one rewrites it (the
    // norm's read below waits for the stream; this update's downloads follow
    // backward_done).
    offload_finish(t);
    order_after_uploads(t, t->n_chunks);
    const float norm = *read_scalar(t, t->grad_norm);
    t->clip_scale = adamw_clip_scale(norm, max_grad_norm);
    t->hyper = *h;
    t->adamw.step++;
    cudaCheck(cudaEventRecord(t->backward_done, t->stream));
    cudaCheck(cudaStreamWaitEvent(t->down_stream, t->backward_done, 0));
    t->waited = 0;
    t->grads_zeroed = true;
    offload_pipeline_start(t->pipeline);  // the worker reads the fields set above
}

// Clipping uses the device norm that grad_norm left in t->grad_norm.
static void cuda_optimizer_step(void *state, const AdamWHyper *h, double grad_norm,
                                double max_grad_norm) {
    (void)grad_norm;
    CudaTrainer *t = (CudaTrainer *)state;
    if (t->offload) return offload_step(t, h, (float)max_grad_norm);
    adamw_step_cuda(&t->adamw, t->table, h, t->weights, t->master_lo, t->grads, t->grad_norm,
                    (float)max_grad_norm, t->stream);
}

// A finite norm means every element is finite; only then is the buffer left on the GPU.
static const char *cuda_first_nonfinite(void *state, bool grads) {
    CudaTrainer *t = (CudaTrainer *)state;
    if (!grads && t->offload) {  // the master is on the host; where, only when not finite
        // A running update is checked when it finishes (offload_finish): not here, so
        // that the step returns while it runs.
        if (offload_pipeline_running(t->pipeline) || t->finite) return NULL;
        return param_table_first_nonfinite(t->table, t->host_params);
    }
    if (grads && t->offload) order_after_uploads(t, t->n_chunks);
    if (grads)
        grad_global_norm_cuda(t->weight_norm, t->grads, t->n, t->stream);
    else
        split_global_norm_cuda(t->weight_norm, t->weights, t->master_lo, t->n, t->stream);
    if (isfinite(*read_scalar(t, t->weight_norm))) return NULL;
    float *host = (float *)xmalloc(t->n * sizeof(float));
    if (grads)
        cuda_get_grads(t, host);
    else
        transfer_master(t, host, cudaMemcpyDeviceToHost);
    const char *name = param_table_first_nonfinite(t->table, host);
    free(host);
    return name;
}

static bool cuda_device_memory(size_t *used, size_t *total) {
    size_t free_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, total));
    *used = *total - free_bytes;
    return true;
}

static void *pinned_alloc(size_t bytes) {
    if (g_device >= 0) cudaCheck(cudaSetDevice(g_device));
    void *p = nullptr;
    cudaCheck(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault));
    return p;
}

static void pinned_free(void *p) {
    if (g_device >= 0) cudaCheck(cudaSetDevice(g_device));
    cudaCheck(cudaFreeHost(p));
}

const TrainBackendOps *cuda_train_backend(void) {
    static TrainBackendOps ops;  // C++17 has no designated initializers
    ops.name = "cuda";
    ops.create = cuda_create;
    ops.destroy = cuda_destroy;
    ops.set_state = cuda_set_state;
    ops.get_state = cuda_get_state;
    ops.zero_grads = cuda_zero_grads;
    ops.forward_backward = cuda_forward_backward;
    ops.forward = cuda_forward;
    ops.all_reduce_grads = cuda_all_reduce_grads;
    ops.reduce_grads_during_backward = cuda_reduce_grads_during_backward;
    ops.get_grads = cuda_get_grads;
    ops.grad_norm = cuda_grad_norm;
    ops.optimizer_step = cuda_optimizer_step;
    ops.first_nonfinite = cuda_first_nonfinite;
    ops.device_memory = cuda_device_memory;
    ops.host_allocator.alloc = pinned_alloc;
    ops.host_allocator.free = pinned_free;
    return &ops;
}
