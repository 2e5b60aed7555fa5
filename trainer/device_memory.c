#include "trainer/device_memory.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "model/model_arena.h"

// Mirrors the ops' process-wide scratch (model/ops_cuda_state.cu): a 32 MiB cuBLASLt
// workspace.
#define CUBLASLT_WORKSPACE ((size_t)32 << 20)
// The CUDA runtime's lazily loaded kernels and cuBLAS handles.
#define RUNTIME_MARGIN ((size_t)256 << 20)

// cuda_memory_estimate, with train.offload_activations' arena when offload_activations.
static CudaMemoryEstimate estimate(const ModelConfig *mc, int micro_rows, int seq_len,
                                   ModelRecompute recompute, bool offload_activations,
                                   size_t attn_workspace_bytes) {
    ParamTable table;  // the exact count (biases, q/k norms, tying), metadata only
    param_table_build(mc, &table);
    const size_t n = table.total;
    param_table_free(&table);
    const size_t T = (size_t)micro_rows * (size_t)seq_len, C = mc->hidden_size;
    CudaMemoryEstimate e = {.tokens = (long long)T};
    // bf16 weights (the master's high halves), its low halves, fp32 gradients, m | v | two
    // norms (trainer/backend_cuda.cu).
    e.state = 2 * n + 2 * n + 4 * n + 4 * (2 * n + 2);
    e.arena = cuda_arena_layout_offload(mc, micro_rows, seq_len, recompute, offload_activations,
                                        attn_workspace_bytes).bytes;
    // cuBLASLt workspace; the embedding sort's keys, values and temp (about as much
    // again); rmsnorm partials of 256 groups x C.
    e.scratch = CUBLASLT_WORKSPACE + 4 * T * 5 + 4 * 256 * C + RUNTIME_MARGIN;
    e.total = e.state + e.arena + e.scratch;
    return e;
}

CudaMemoryEstimate cuda_memory_estimate(const ModelConfig *mc, int micro_rows, int seq_len,
                                        ModelRecompute recompute, size_t attn_workspace_bytes) {
    return estimate(mc, micro_rows, seq_len, recompute, false, attn_workspace_bytes);
}

static size_t param_count(const ModelConfig *mc) {
    ParamTable table;
    param_table_build(mc, &table);
    const size_t n = table.total;
    param_table_free(&table);
    return n;
}

CudaMemoryEstimate cuda_memory_request_estimate(const CudaMemoryRequest *r) {
    const size_t workspace = r->workspace ? r->workspace(r->mc, r->micro_rows, r->seq_len) : 0;
    CudaMemoryEstimate e = estimate(r->mc, r->micro_rows, r->seq_len, r->recompute,
                                    r->offload_activations, workspace);
    if (r->lora) {  // LoRA and the offloaded optimizer are not combined (run_settings_from)
        const size_t n = param_count(r->mc);
        LoraLayout l;
        lora_layout_build(r->mc, r->lora, &l);
        const size_t a = l.table.total, width = (size_t)l.max_group * (size_t)l.cfg.r;
        lora_layout_free(&l);
        e.state = 2 * n + 2 * a + 2 * a + 4 * a + 4 * (2 * a + 2);  // trainer/backend_cuda.cu
        e.scratch += 2 * 2 * (size_t)e.tokens * width;  // model/model_cuda.cu's lora_u, lora_du
        e.total = e.state + e.arena + e.scratch;
        return e;
    }
    if (r->offload_optimizer) {  // bf16 weights, fp32 gradients, two norms
        const size_t n = param_count(r->mc);
        e.total -= e.state;
        e.state = 2 * n + 4 * n + 4 * 2;
        e.total += e.state;
    }
    return e;
}

size_t host_state_bytes(size_t params) { return 12 * params; }

size_t cuda_offload_ring_elements(size_t n) {
    const size_t ring = CUDA_OFFLOAD_SLOTS * CUDA_OFFLOAD_CHUNK;
    return n < ring ? n : ring;
}

size_t cuda_offload_host_bytes(const ModelConfig *mc) {
    const size_t n = param_count(mc);
    // fp32 master, m, v; the rings of gradients coming down (fp32) and weights going up (bf16)
    return host_state_bytes(n) + (4 + 2) * cuda_offload_ring_elements(n);
}

size_t cuda_activations_host_bytes(const CudaMemoryRequest *r) {
    const CudaArenaLayout a = cuda_arena_layout_offload(r->mc, r->micro_rows, r->seq_len,
                                                        r->recompute, r->offload_activations, 0);
    return a.offloaded * 2 * (size_t)r->micro_rows * (size_t)r->seq_len *
           (size_t)r->mc->hidden_size;  // bf16
}

size_t cuda_host_pinned_bytes(const CudaMemoryRequest *r) {
    return (r->offload_optimizer ? cuda_offload_host_bytes(r->mc) : 0) +
           cuda_activations_host_bytes(r);
}

size_t lora_host_state_bytes(const ModelConfig *mc, const LoraConfig *lora) {
    LoraLayout l;
    lora_layout_build(mc, lora, &l);
    const size_t adapters = l.table.total;
    lora_layout_free(&l);
    return 4 * param_count(mc) + 16 * adapters;
}

size_t cuda_run_host_bytes(const CudaMemoryRequest *r) {
    // Offloaded, the state's copy is the backend's pinned master and moments.
    const size_t state = r->lora ? lora_host_state_bytes(r->mc, r->lora)
                         : r->offload_optimizer ? 0 : host_state_bytes(param_count(r->mc));
    return state + cuda_host_pinned_bytes(r);
}

size_t host_memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kib;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
                fclose(f);
                return (size_t)kib * 1024;
            }
        fclose(f);
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

static const double GIB = 1024.0 * 1024.0 * 1024.0;

// The request with other settings, and whether it fits free_bytes (its total in *total).
static bool fits(const CudaMemoryRequest *r, int micro_rows, int seq_len, ModelRecompute mode,
                 size_t free_bytes, size_t *total) {
    CudaMemoryRequest other = *r;
    other.micro_rows = micro_rows;
    other.seq_len = seq_len;
    other.recompute = mode;
    *total = cuda_memory_request_estimate(&other).total;
    return *total <= free_bytes;
}

// The largest micro_rows in [1, below) that fits with mode, or 0.
static int largest_rows(const CudaMemoryRequest *r, int below, ModelRecompute mode,
                        size_t free_bytes, size_t *total) {
    int lo = 0, hi = below;  // fits(lo) (or lo == 0), not fits(hi)
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        if (fits(r, mid, r->seq_len, mode, free_bytes, total)) lo = mid;
        else hi = mid;
    }
    if (lo > 0) fits(r, lo, r->seq_len, mode, free_bytes, total);
    return lo;
}

// The largest seq_len in [1, below) that fits one row with mode (a multiple of 64 when
// at least 64), or 0.
static int largest_seq_len(const CudaMemoryRequest *r, int below, ModelRecompute mode,
                           size_t free_bytes, size_t *total) {
    int lo = 0, hi = below;
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        if (fits(r, 1, mid, mode, free_bytes, total)) lo = mid;
        else hi = mid;
    }
    if (lo >= 64) lo -= lo % 64;
    if (lo > 0) fits(r, 1, lo, mode, free_bytes, total);
    return lo;
}

// Appends printf-style text to buf (of len, holding a string).
__attribute__((format(printf, 3, 4))) static void append(char *buf, size_t len, const char *fmt, ...) {
    const size_t used = strlen(buf);
    if (used + 1 >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

int cuda_memory_check(const CudaMemoryRequest *r, size_t free_bytes, size_t total_bytes,
                      CudaMemoryEstimate *out, char *err, size_t err_len) {
    const int micro_rows = r->micro_rows, seq_len = r->seq_len;
    const long long tokens = (long long)micro_rows * seq_len;
    if (tokens > INT_MAX)
        return fail(err, err_len, "config keys train.micro_rows x data.seq_len: %d x %d = %lld "
                    "tokens per micro-batch, more than the CUDA kernels index (%d); lower "
                    "train.micro_rows", micro_rows, seq_len, tokens, INT_MAX);
    const CudaMemoryEstimate e = cuda_memory_request_estimate(r);
    if (out) *out = e;
    if (e.total <= free_bytes) return 0;

    char fix[768] = "";
    size_t total;
    // A cheaper mode at the same micro-batch: mlp from none, then layer.
    const ModelRecompute cheaper[] = {MODEL_RECOMPUTE_MLP, MODEL_RECOMPUTE_LAYER};
    for (int i = 0; i < 2 && !*fix; i++) {
        const ModelRecompute mode = cheaper[i];
        if (mode == r->recompute ||
            (mode == MODEL_RECOMPUTE_MLP && r->recompute != MODEL_RECOMPUTE_NONE))
            continue;
        if (fits(r, micro_rows, seq_len, mode, free_bytes, &total))
            append(fix, sizeof fix, "train.recompute=%s (about %.2f GiB)",
                   model_recompute_name(mode), total / GIB);
    }
    // The layer inputs on the host (with layer), at the same micro-batch.
    CudaMemoryRequest host_inputs = *r;
    host_inputs.recompute = MODEL_RECOMPUTE_LAYER;
    host_inputs.offload_activations = true;
    const char *with_layer = r->recompute == MODEL_RECOMPUTE_LAYER ? "" : "train.recompute=layer and ";
    if (!*fix && !r->offload_activations &&
        (total = cuda_memory_request_estimate(&host_inputs).total) <= free_bytes)
        append(fix, sizeof fix, "%strain.offload_activations=true (about %.2f GiB)", with_layer,
               total / GIB);
    // The optimizer's state on the host, at the same micro-batch, alone or with the layer
    // inputs.
    if (!*fix && !r->offload_optimizer) {
        CudaMemoryRequest offloaded = *r, both = host_inputs;
        offloaded.offload_optimizer = both.offload_optimizer = true;
        if ((total = cuda_memory_request_estimate(&offloaded).total) <= free_bytes)
            append(fix, sizeof fix, "train.offload_optimizer=true (about %.2f GiB)", total / GIB);
        else if (!r->offload_activations &&
                 (total = cuda_memory_request_estimate(&both).total) <= free_bytes)
            append(fix, sizeof fix, "train.offload_optimizer=true with %strain.offload_activations="
                   "true (about %.2f GiB)", with_layer, total / GIB);
    }
    // Fewer rows per micro-batch, with this mode, else with layer, else with the layer
    // inputs on the host too.
    int rows = largest_rows(r, micro_rows, r->recompute, free_bytes, &total);
    if (rows > 0) {
        append(fix, sizeof fix, "%strain.micro_rows=%d (about %.2f GiB)", *fix ? ", or " : "",
               rows, total / GIB);
    } else if (r->recompute != MODEL_RECOMPUTE_LAYER &&
               (rows = largest_rows(r, micro_rows, MODEL_RECOMPUTE_LAYER, free_bytes, &total)) > 0) {
        append(fix, sizeof fix,
               "%strain.micro_rows=%d with train.recompute=layer (about %.2f GiB)",
               *fix ? ", or " : "", rows, total / GIB);
    } else if (!r->offload_activations &&
               (rows = largest_rows(&host_inputs, micro_rows, MODEL_RECOMPUTE_LAYER, free_bytes,
                                    &total)) > 0) {
        append(fix, sizeof fix,
               "%strain.micro_rows=%d with train.recompute=layer and train.offload_activations="
               "true (about %.2f GiB)", *fix ? ", or " : "", rows, total / GIB);
    }
    // Shorter rows: the last resort (a conversation must fit one row).
    if (!*fix) {
        const int seq = largest_seq_len(r, seq_len, MODEL_RECOMPUTE_LAYER, free_bytes, &total);
        if (seq > 0)
            append(fix, sizeof fix,
                   "data.seq_len=%d with train.micro_rows=1 and train.recompute=layer (about "
                   "%.2f GiB; longer conversations then need data.skip_too_long)",
                   seq, total / GIB);
    }
    if (!*fix)
        snprintf(fix, sizeof fix, "none of train.recompute, train.offload_activations, "
                 "train.micro_rows, data.seq_len does: lower the model's size");
    return fail(err, err_len, "config keys train.micro_rows x data.seq_len, train.recompute and "
                "model.*: the CUDA backend needs about %.2f GiB of device memory, %.2f GiB are "
                "free (of %.2f): %.2f GiB of activations for %d x %d tokens per micro-batch "
                "(train.micro_rows x data.seq_len) with train.recompute=%s%s, %.2f GiB of weights, "
                "gradients and AdamW state (model.hidden_size, model.intermediate_size, "
                "model.num_hidden_layers, model.vocab_size), %.2f GiB of scratch; it fits with %s",
                e.total / GIB, free_bytes / GIB, total_bytes / GIB, e.arena / GIB, micro_rows,
                seq_len, model_recompute_name(r->recompute),
                r->offload_activations ? " and train.offload_activations=true" : "",
                e.state / GIB, e.scratch / GIB, fix);
}

int cuda_offload_host_check(const ModelConfig *mc, size_t available_bytes, char *err,
                            size_t err_len) {
    const size_t need = cuda_offload_host_bytes(mc);
    if (need <= available_bytes) return 0;
    return fail(err, err_len, "config key train.offload_optimizer: the offloaded optimizer needs "
                "about %.2f GiB of pinned host memory (12 bytes per parameter: fp32 master "
                "weights, AdamW m, v; and the rings of chunks going down and up), %.2f GiB are available; set "
                "train.offload_optimizer=false or lower the model's size (the model.* keys)",
                need / GIB, available_bytes / GIB);
}

int cuda_activations_host_check(const CudaMemoryRequest *r, size_t available_bytes, char *err,
                                size_t err_len) {
    const size_t inputs = cuda_activations_host_bytes(r);
    if (inputs == 0) return 0;
    const size_t optimizer = r->offload_optimizer ? cuda_offload_host_bytes(r->mc) : 0;
    if (inputs + optimizer <= available_bytes) return 0;
    char with[160] = "";
    if (optimizer)
        snprintf(with, sizeof with, " (and %.2f GiB of train.offload_optimizer's)",
                 optimizer / GIB);
    return fail(err, err_len, "config key train.offload_activations: the layer inputs of %d x %d "
                "tokens (train.micro_rows x data.seq_len) need about %.2f GiB of pinned host "
                "memory%s, %.2f GiB are available; lower train.micro_rows or data.seq_len, or set "
                "train.offload_activations=false", r->micro_rows, r->seq_len, inputs / GIB, with,
                available_bytes / GIB);
}
