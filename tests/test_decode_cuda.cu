// The CUDA KV-cache decoder and its attention kernel against fp32 CPU oracles:
//  1. attention_decode_cuda vs attention_decode_cpu on the same bf16-rounded random q and
//     caches: GQA groups 1..8, head dims 32, 36 (2-element loads), 40, 64, 128, 256, cache
//     lengths that are multiples of no tile (1, 31, 33, 129, ...), split-K and single-split
//     calls, a token with no key (zero output); error <= 1e-2 of the output scale, cosine
//     >= 0.9999, and bitwise reproducible.
//  2. cuda_decoder_forward's logits vs cpu_model_logits (a full causal forward over each
//     sequence's tokens, the same bf16-rounded weights) for llama (head_dim 64, untied),
//     llama with head_dim 128 != hidden / heads, 4 query heads per KV head and llama3 RoPE
//     scaling (tied), qwen2 (q/k/v biases) and qwen3 (q_norm/k_norm, head_dim 32):
//     prefills and single tokens of several slots interleaved in one call, sequences of
//     different lengths, one filling its cache to max_len, positions from past 0 and with
//     gaps; once more in 7-token chunks (a prefill cut across chunks). bf16 tolerance:
//     every logit row at cosine >= 0.999 against the oracle's, and max |error| <= 5e-2 of
//     max |logit| (a CPU emulation rounding to bf16 after every op, as the GPU ops do,
//     gave >= 0.99987 and <= 1.8e-2 over seeds). Weights are random: norm weights 1 +- 0.3,
//     biases +- 0.3, q/k projections x4 so attention is peaked (a wrong key shows).
//     The same comparison against cuda_model_logits (the CUDA training model's full
//     forward) where it runs the head dim (64, 128).
//  3. Reset reuses a slot: two sequences follow others in slots 1 and 2 after
//     cuda_decoder_reset; their logits match the oracle as if the slot were fresh.
#include "model/decode_cuda.h"
#include "model/model_cuda.h"

#include <math.h>
#include <string.h>
#include <vector>
#include "attention/attention_decode_cuda.h"
#include "common/cuda_check.h"
#include "model/ops_cuda.h"
#include "tests/test_cuda_util.cuh"
#include "tests/test_model_util.h"
#include "tests/test_util.h"

static TestRng rng;

static float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Random values in [-scale, scale), rounded to bf16: the host floats and the device copy.
static std::vector<float> random_bf16(size_t n, float scale, __nv_bfloat16 **dev) {
    std::vector<float> host(n);
    std::vector<__nv_bfloat16> bits(n);
    for (size_t i = 0; i < n; i++) {
        bits[i] = __float2bfloat16_rn(scale * test_rng_uniform(&rng));
        host[i] = __bfloat162float(bits[i]);
    }
    cudaCheck(cudaMalloc(dev, n * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemcpy(*dev, bits.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    return host;
}

static std::vector<float> download_bf16(const __nv_bfloat16 *dev, size_t n) {
    std::vector<__nv_bfloat16> bits(n);
    cudaCheck(cudaMemcpy(bits.data(), dev, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(bits[i]);
    return out;
}

static int32_t *upload_ints(const std::vector<int32_t> &v) {
    int32_t *dev;
    cudaCheck(cudaMalloc(&dev, v.size() * sizeof(int32_t)));
    cudaCheck(cudaMemcpy(dev, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    return dev;
}

// ---------------------------------------------------------------- 1. the kernel

typedef struct {
    int n_tokens, n_heads, n_kv_heads, head_dim, n_seqs, max_len;
    bool max_keys_is_max_len;  // else the largest n_keys of the call
} KernelCase;

static void kernel_case(const KernelCase *c) {
    const int N = c->n_tokens, H = c->n_heads, D = c->head_dim;
    const size_t q_elems = (size_t)N * H * D;
    const size_t cache_elems = (size_t)c->n_seqs * c->max_len * c->n_kv_heads * D;
    __nv_bfloat16 *q_dev, *k_dev, *v_dev, *out_dev;
    const std::vector<float> q = random_bf16(q_elems, 4.0f, &q_dev);  // peaked softmax
    const std::vector<float> k = random_bf16(cache_elems, 1.0f, &k_dev);
    const std::vector<float> v = random_bf16(cache_elems, 1.0f, &v_dev);
    cudaCheck(cudaMalloc(&out_dev, q_elems * sizeof(__nv_bfloat16)));

    // Edge lengths first (the whole cache, tile boundaries of 32 and 128 +- 1), then
    // random; the last token sees nothing.
    const int edges[] = {c->max_len, 1, 31, 33, 127, 129, 255, 257};
    std::vector<int32_t> slot(N), n_keys(N);
    int max_keys = 0;
    for (int i = 0; i < N; i++) {
        slot[i] = test_rng_int(&rng, 0, c->n_seqs - 1);
        const int edge = i < 8 ? edges[i] : 0;
        n_keys[i] = edge > 0 && edge <= c->max_len ? edge : test_rng_int(&rng, 1, c->max_len);
        if (i == N - 1 && N > 1) n_keys[i] = 0;
        if (n_keys[i] > max_keys) max_keys = n_keys[i];
    }
    const DecodeShape shape = {N, H, c->n_kv_heads, D, c->n_seqs, c->max_len,
                               c->max_keys_is_max_len ? c->max_len : max_keys,
                               1.0f / sqrtf((float)D)};
    std::vector<float> want(q_elems);
    attention_decode_cpu(&shape, q.data(), k.data(), v.data(), slot.data(), n_keys.data(),
                         want.data());

    int32_t *slot_dev = upload_ints(slot), *keys_dev = upload_ints(n_keys);
    const size_t ws_bytes = attention_decode_workspace_bytes(&shape);
    void *ws = nullptr;
    cudaCheck(cudaMalloc(&ws, ws_bytes ? ws_bytes : 1));
    attention_decode_cuda(&shape, q_dev, k_dev, v_dev, slot_dev, keys_dev, out_dev, ws, 0);
    const std::vector<float> got = download_bf16(out_dev, q_elems);
    attention_decode_cuda(&shape, q_dev, k_dev, v_dev, slot_dev, keys_dev, out_dev, ws, 0);
    const std::vector<float> again = download_bf16(out_dev, q_elems);

    std::vector<double> want_d(want.begin(), want.end());
    const double rel = test_relative_error(got.data(), want_d.data(), q_elems);
    const double cosine = test_cosine(got.data(), want.data(), q_elems);
    bool empty_zero = true;
    if (N > 1)
        for (int j = 0; j < H * D; j++) empty_zero &= got[(size_t)(N - 1) * H * D + j] == 0.0f;
    printf("  kernel N=%d H=%d KV=%d D=%d cache %dx%d max_keys %d workspace %zu B: rel err "
           "%.2e cosine %.7f\n",
           N, H, c->n_kv_heads, D, c->n_seqs, c->max_len, shape.max_keys, ws_bytes, rel, cosine);
    EXPECT(rel <= 1e-2, "decode attention N=%d D=%d: relative error %.3e", N, D, rel);
    EXPECT(cosine >= 0.9999, "decode attention N=%d D=%d: cosine %.7f", N, D, cosine);
    EXPECT(empty_zero, "decode attention N=%d D=%d: a token with no key has a nonzero output", N,
           D);
    EXPECT(memcmp(got.data(), again.data(), q_elems * sizeof(float)) == 0,
           "decode attention N=%d D=%d: two runs differ", N, D);
    cudaCheck(cudaFree(q_dev));
    cudaCheck(cudaFree(k_dev));
    cudaCheck(cudaFree(v_dev));
    cudaCheck(cudaFree(out_dev));
    cudaCheck(cudaFree(slot_dev));
    cudaCheck(cudaFree(keys_dev));
    cudaCheck(cudaFree(ws));
}

static void test_kernel(void) {
    printf("decode attention kernel vs CPU\n");
    const KernelCase cases[] = {
        {3, 8, 2, 64, 4, 1000, false},   // few tokens: split-K over long caches
        {5, 8, 1, 128, 3, 300, true},    // group of 8, max_keys = cache length
        {40, 4, 4, 32, 6, 97, false},    // no GQA, head_dim 32
        {70, 32, 4, 128, 8, 515, false}, // the TinyLlama shape
        {9, 6, 3, 40, 2, 200, false},    // head_dim 40: lanes past the last pair idle
        {4, 2, 1, 36, 2, 150, true},     // head_dim 36: 2-element key loads
        {2, 4, 2, 256, 2, 600, false},   // head_dim 256
        {600, 4, 2, 64, 16, 64, false},  // many tokens: one split
        {1, 4, 2, 64, 1, 1, false},      // a single key
    };
    for (const KernelCase &c : cases) kernel_case(&c);
}

// ---------------------------------------------------------------- 2, 3. the decoder

enum { MAX_LEN = 80, N_SLOTS = 3 };

// One sequence of a schedule: fed to `slot` from step `start` (its prompt at once, then
// one token per step) until all `len` tokens are in.
typedef struct {
    int slot, len, prompt, start, pos0;
} SeqPlan;

// Slots 1 and 2 are reused after their first sequences end (cuda_decoder_reset).
static const SeqPlan PLANS[] = {
    {0, MAX_LEN, 30, 0, 0},  // fills its cache exactly
    {1, 25, 1, 3, 2},        // starts mid-way from a single token
    {2, 40, 17, 0, 5},
    {1, 33, 9, 30, 0},       // reuses slot 1 (sequence 1 ends at step 27)
    {2, 12, 12, 24, 3},      // reuses slot 2 (sequence 2 ends at step 23): a prefill only
};
enum { N_SEQS = sizeof(PLANS) / sizeof(PLANS[0]) };

// Position of token k of sequence j: from pos0, with a gap of j in the second half, so
// RoPE positions are not the cache positions plus a constant (RoPE sees only differences).
static int plan_pos(int j, int k) {
    return PLANS[j].pos0 + k + (2 * k >= PLANS[j].len ? j : 0);
}

// Random weights that exercise every tensor: params_init, then norm weights 1 +- 0.3,
// biases +- 0.3, and q/k projections x4 (peaked attention), rounded to bf16.
static std::vector<float> random_weights(const ModelConfig *cfg, const ParamTable *t) {
    std::vector<float> p(t->total);
    params_init(cfg, t, test_rng_next(&rng), p.data());
    for (int i = 0; i < t->n_tensors; i++) {
        const ParamTensor *pt = &t->tensors[i];
        const bool qk = strstr(pt->name, "q_proj.weight") || strstr(pt->name, "k_proj.weight");
        for (size_t j = pt->offset; j < pt->offset + pt->numel; j++) {
            if (pt->is_norm) p[j] = 1.0f + 0.3f * test_rng_uniform(&rng);
            else if (pt->is_bias) p[j] = 0.3f * test_rng_uniform(&rng);
            else if (qk) p[j] *= 4.0f;
        }
    }
    for (float &x : p) x = bf16_round(x);
    return p;
}

// The full forwards over every sequence as one row (causal, padded to MAX_LEN), logits
// [N_SEQS * MAX_LEN, V]: cpu_model_logits into *cpu (the oracle), and cuda_model_logits
// (the training model, bf16 too) into *gpu when the CUDA model runs the head dim, else
// *gpu is left empty.
static void full_forward_logits(const ModelConfig *cfg, const float *params,
                                const void *params_dev, const std::vector<int32_t> *tokens,
                                std::vector<float> *cpu, std::vector<float> *gpu) {
    const int T = N_SEQS * MAX_LEN;
    std::vector<int32_t> token(T, 0), target(T, -1), pos(T, 0), lo(T), hi(T);
    for (int j = 0; j < N_SEQS; j++)
        for (int k = 0; k < MAX_LEN; k++) {
            const int at = j * MAX_LEN + k;
            const bool real = k < PLANS[j].len;
            lo[at] = k;
            hi[at] = real ? PLANS[j].len : k;  // padding: visible to nobody
            if (real) token[at] = tokens[j][k], pos[at] = plan_pos(j, k);
        }
    AttnMask mask;
    attn_mask_build(lo.data(), hi.data(), N_SEQS, MAX_LEN, ATTN_TILE, ATTN_TILE, &mask);
    const ModelBatch batch = {N_SEQS, MAX_LEN, token.data(), target.data(), pos.data(), &mask};
    CpuModel *m = cpu_model_create(cfg, N_SEQS, MAX_LEN, MODEL_RECOMPUTE_NONE);
    cpu->assign((size_t)T * cfg->vocab_size, 0.0f);
    cpu_model_logits(m, params, &batch, cpu->data());
    cpu_model_free(m);
    gpu->clear();
    const ModelDims dims = model_dims(cfg);
    if (model_dims_cuda_supported(&dims)) {
        CudaModel *g = cuda_model_create(cfg, N_SEQS, MAX_LEN, MODEL_RECOMPUTE_MLP);
        gpu->assign((size_t)T * cfg->vocab_size, 0.0f);
        cuda_model_logits(g, params_dev, &batch, gpu->data());
        cuda_model_free(g);
    }
    attn_mask_free(&mask);
}

// Runs the schedule through the decoder; got[j] receives sequence j's logits [len, V].
static void run_schedule(CudaDecoder *dec, const void *params_dev, int V,
                         const std::vector<int32_t> *tokens, std::vector<float> *got) {
    int fed[N_SEQS] = {0};
    int slot_owner[N_SLOTS];
    for (int s = 0; s < N_SLOTS; s++) slot_owner[s] = -1;
    std::vector<int32_t> slot, token, pos, seq, index;
    std::vector<float> logits;
    bool lengths_ok = true;
    for (int step = 0;; step++) {
        slot.clear(), token.clear(), pos.clear(), seq.clear(), index.clear();
        bool pending = false;
        // How many tokens each sequence feeds now; then round-robin across them, so the
        // slots of one call interleave (each slot's tokens stay in order).
        int want[N_SEQS] = {0};
        for (int j = 0; j < N_SEQS; j++) {
            const SeqPlan *p = &PLANS[j];
            if (fed[j] == p->len) continue;
            pending = true;
            if (step < p->start) continue;
            if (fed[j] == 0) {
                if (slot_owner[p->slot] >= 0) {
                    EXPECT(fed[slot_owner[p->slot]] == PLANS[slot_owner[p->slot]].len,
                           "schedule: sequence %d starts while slot %d is busy", j, p->slot);
                    cuda_decoder_reset(dec, p->slot);
                    EXPECT(cuda_decoder_length(dec, p->slot) == 0, "reset slot %d: length %d",
                           p->slot, cuda_decoder_length(dec, p->slot));
                }
                slot_owner[p->slot] = j;
                want[j] = p->prompt;
            } else {
                want[j] = 1;
            }
        }
        if (!pending) break;
        for (int r = 0;; r++) {
            bool any = false;
            for (int j = 0; j < N_SEQS; j++)
                if (r < want[j]) {
                    const int k = fed[j] + r;
                    slot.push_back(PLANS[j].slot), token.push_back(tokens[j][k]);
                    pos.push_back(plan_pos(j, k)), seq.push_back(j), index.push_back(k);
                    any = true;
                }
            if (!any) break;
        }
        const int n = (int)slot.size();
        logits.resize((size_t)n * V);
        cuda_decoder_forward(dec, params_dev, n, slot.data(), token.data(), pos.data(),
                             logits.data());
        for (int i = 0; i < n; i++)
            memcpy(got[seq[i]].data() + (size_t)index[i] * V, logits.data() + (size_t)i * V,
                   (size_t)V * sizeof(float));
        for (int j = 0; j < N_SEQS; j++) {
            fed[j] += want[j];
            if (want[j] && slot_owner[PLANS[j].slot] == j)
                lengths_ok &= cuda_decoder_length(dec, PLANS[j].slot) == fed[j];
        }
    }
    EXPECT(lengths_ok, "cuda_decoder_length follows the tokens fed");
    cuda_decoder_forward(dec, params_dev, 0, nullptr, nullptr, nullptr, nullptr);  // a no-op
}

// Worst row cosine and max |error| / max |logit| of got against the oracle rows.
static void compare_logits(const char *label, int V, const std::vector<float> *got,
                           const std::vector<float> &want) {
    double worst_cosine = 1.0, max_err = 0.0, max_want = 1e-30;
    int worst_seq = -1, worst_index = -1;
    for (int j = 0; j < N_SEQS; j++)
        for (int k = 0; k < PLANS[j].len; k++) {
            const float *g = got[j].data() + (size_t)k * V;
            const float *w = want.data() + ((size_t)j * MAX_LEN + k) * V;
            const double c = test_cosine(g, w, (size_t)V);
            if (!(c >= worst_cosine)) worst_cosine = c, worst_seq = j, worst_index = k;
            for (int t = 0; t < V; t++) {
                max_err = isfinite(g[t]) ? fmax(max_err, fabs(g[t] - w[t])) : INFINITY;
                max_want = fmax(max_want, fabs(w[t]));
            }
        }
    const double rel = max_err / max_want;
    printf("  %s: worst row cosine %.6f (sequence %d token %d), max error %.3e of max |logit| "
           "%.3f (%.2e)\n",
           label, worst_cosine, worst_seq, worst_index, max_err, max_want, rel);
    EXPECT(worst_cosine >= 0.999, "%s: logits of sequence %d token %d at cosine %.6f", label,
           worst_seq, worst_index, worst_cosine);
    EXPECT(rel <= 5e-2, "%s: max logit error %.3e relative to max |logit|", label, rel);
}

static void test_decoder(const char *label, const ModelConfig *cfg) {
    const ModelDims dims = model_dims(cfg);
    printf("decoder %s: V=%d C=%d F=%d L=%d H=%d KV=%d head_dim=%d %s head%s%s\n", label,
           cfg->vocab_size, cfg->hidden_size, cfg->intermediate_size, cfg->num_hidden_layers,
           cfg->num_attention_heads, cfg->num_key_value_heads, dims.head_dim,
           cfg->tie_word_embeddings ? "tied" : "untied", cfg->attention_bias ? ", q/k/v bias" : "",
           cfg->qk_norm ? ", q/k norm" : "");
    ParamTable table;
    param_table_build(cfg, &table);
    const std::vector<float> params = random_weights(cfg, &table);
    std::vector<__nv_bfloat16> bits(table.total);
    for (size_t i = 0; i < table.total; i++) bits[i] = __float2bfloat16_rn(params[i]);
    __nv_bfloat16 *params_dev;
    cudaCheck(cudaMalloc(&params_dev, table.total * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemcpy(params_dev, bits.data(), table.total * sizeof(__nv_bfloat16),
                         cudaMemcpyHostToDevice));

    const int V = cfg->vocab_size;
    std::vector<int32_t> tokens[N_SEQS];
    for (int j = 0; j < N_SEQS; j++)
        for (int k = 0; k < PLANS[j].len; k++) tokens[j].push_back(test_rng_int(&rng, 0, V - 1));
    std::vector<float> want, gpu_full;
    full_forward_logits(cfg, params.data(), params_dev, tokens, &want, &gpu_full);

    std::vector<float> got[N_SEQS];
    for (int j = 0; j < N_SEQS; j++) got[j].assign((size_t)PLANS[j].len * V, NAN);
    CudaDecoder *dec = cuda_decoder_create(cfg, N_SLOTS, MAX_LEN);
    printf("  cache %.2f MiB, activations %.2f MiB\n", cuda_decoder_cache_bytes(dec) / 1048576.0,
           cuda_decoder_arena_bytes(dec) / 1048576.0);
    run_schedule(dec, params_dev, V, tokens, got);
    compare_logits("incremental", V, got, want);
    // Beside the oracle, the CUDA training model's full forward (bf16 as well).
    if (!gpu_full.empty()) compare_logits("incremental vs cuda_model_logits", V, got, gpu_full);

    // The same schedule again on the same decoder (every slot reset first) in 7-token
    // chunks: prefills cut across chunks.
    for (int s = 0; s < N_SLOTS; s++) cuda_decoder_reset(dec, s);
    cuda_decoder_set_chunk_tokens(dec, 7);
    for (int j = 0; j < N_SEQS; j++) got[j].assign((size_t)PLANS[j].len * V, NAN);
    run_schedule(dec, params_dev, V, tokens, got);
    compare_logits("7-token chunks", V, got, want);

    cuda_decoder_free(dec);
    cudaCheck(cudaFree(params_dev));
    param_table_free(&table);
}

// V = 512, 2 layers, hidden 256, 4 query heads sharing 2 KV heads.
static ModelConfig base_config(void) { return test_model_config(512, 256, 512, 2, 4, 2); }

int main(void) {
    SKIP_WITHOUT_CUDA_DEVICE();
    rng = test_rng_from_env();
    test_kernel();

    ops_cuda_init(1024, 1024);
    const ModelConfig llama = base_config();  // 4 heads of 64, 2 KV heads, untied
    test_decoder("llama", &llama);
    ModelConfig llama128 = base_config();  // head_dim 128 != 256 / 4, 4 heads per KV head
    llama128.num_key_value_heads = 1;
    llama128.head_dim = 128;
    llama128.tie_word_embeddings = true;
    llama128.rope_theta = 500000.0f;
    const RopeScaling llama3_scaling = {ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 32};
    llama128.rope_scaling = llama3_scaling;
    test_decoder("llama head_dim 128, llama3 rope", &llama128);
    ModelConfig qwen2 = base_config();
    qwen2.arch = ARCH_QWEN2;
    qwen2.attention_bias = true;
    qwen2.tie_word_embeddings = true;
    qwen2.rope_theta = 1000000.0f;
    test_decoder("qwen2", &qwen2);
    ModelConfig qwen3 = base_config();  // head_dim 32: q_dim 128 != hidden 256
    qwen3.arch = ARCH_QWEN3;
    qwen3.qk_norm = true;
    qwen3.head_dim = 32;
    qwen3.rope_theta = 1000000.0f;
    test_decoder("qwen3", &qwen3);
    ops_cuda_destroy();
    return test_finish();
}
