// Hugging Face checkpoints on the CUDA backend: the committed CUDA-shape fixtures of
// tests/data/hf_cuda/ (scripts/fixtures/make_hf_fixtures.py --cuda-shapes: head_dim 64,
// Qwen3's 128 != hidden / heads; Llama with linear RoPE scaling and f16 weights, Qwen2 with
// q/k/v biases, Qwen3 with q_norm/k_norm, sharded) through the bf16 CUDA model against the
// transformers fp32 reference: logits at cosine >= 0.999 (every position, and all
// together), mean loss within 5e-3 relative. The check is sharp enough to fail: plain RoPE
// on the scaled Llama and unit q_norm/k_norm weights on Qwen3 (transformers: cosine 0.90
// and 0.99) fall below the threshold.
#include <math.h>
#include <string.h>
#include "common/cuda_check.h"
#include "model/model_cuda.h"
#include "model/ops_cuda.h"
extern "C" {  // plain C headers without guards of their own
#include "tests/test_hf_util.h"
}
#include "tests/test_cuda_util.cuh"
#include "tests/test_util.h"

// The fixture's row of S <= ROW tokens is padded to one whole attention tile: pad keys
// are visible to themselves only and have no targets, so positions < S see what
// transformers saw.
enum { ROW = ATTN_TILE, MAX_CHANNELS = 512 };

typedef enum { AS_STORED, PLAIN_ROPE, UNIT_QK_NORM } Mutation;

// The worst per-position logits cosine and the cosine over all logits of the CUDA model
// on a fixture (its weights rounded to bf16), and its mean loss's relative error.
static void fixture_cosines(const char *name, Mutation mutation, double *worst, double *all,
                            double *loss_err) {
    char folder[512];
    snprintf(folder, sizeof folder, "tests/data/hf_cuda/%s", name);
    HfModelConfig hf;
    ParamTable table;
    float *params = load_hf_folder(folder, &hf, &table);
    if (mutation == PLAIN_ROPE) hf.cfg.rope_scaling.type = ROPE_DEFAULT;
    if (mutation == UNIT_QK_NORM)
        for (int i = 0; i < table.n_tensors; i++)
            if (strstr(table.tensors[i].name, "q_norm") || strstr(table.tensors[i].name, "k_norm"))
                for (size_t j = 0; j < table.tensors[i].numel; j++)
                    params[table.tensors[i].offset + j] = 1.0f;
    const ModelConfig *cfg = &hf.cfg;
    const int V = cfg->vocab_size;
    HfReference ref;
    hf_reference_load(folder, V, &ref);
    const int S = ref.S;
    CHECK(S <= ROW && cfg->hidden_size <= MAX_CHANNELS, "%s: %d tokens, hidden %d", name, S,
          cfg->hidden_size);
    int32_t token[ROW], target[ROW], pos[ROW], lo[ROW], hi[ROW];
    for (int i = 0; i < ROW; i++) {
        const bool real = i < S;
        token[i] = real ? ref.token[i] : 0, target[i] = real ? ref.target[i] : -1;
        pos[i] = real ? ref.pos[i] : 0, lo[i] = i, hi[i] = real ? S : i + 1;
    }

    float *params_f32_dev;
    __nv_bfloat16 *params_dev;
    cudaCheck(cudaMalloc(&params_f32_dev, table.total * sizeof(float)));
    cudaCheck(cudaMalloc(&params_dev, table.total * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemcpy(params_f32_dev, params, table.total * sizeof(float),
                         cudaMemcpyHostToDevice));
    float_to_bf16_cuda(params_dev, params_f32_dev, (int64_t)table.total, 0);
    cudaCheck(cudaDeviceSynchronize());

    AttnMask mask;
    attn_mask_build(lo, hi, 1, ROW, ATTN_TILE, ATTN_TILE, &mask);
    const ModelBatch b = {1, ROW, token, target, pos, &mask};
    CudaModel *m = cuda_model_create(cfg, 1, ROW, MODEL_RECOMPUTE_MLP);
    float *logits = (float *)xmalloc((size_t)ROW * V * sizeof(float));
    cuda_model_logits(m, params_dev, &b, logits);
    *worst = 1.0;
    for (int i = 0; i < S; i++)
        *worst = fmin(*worst, test_cosine(logits + (size_t)i * V, ref.logits + (size_t)i * V, V));
    *all = test_cosine(logits, ref.logits, (size_t)S * V);
    const double loss = cuda_model_forward(m, params_dev, &b, NULL) / ref.n_targets;
    *loss_err = fabs(loss - ref.loss) / ref.loss;
    static const char *const what[] = {"", " with plain RoPE", " with unit q_norm/k_norm"};
    printf("%s%s: logits cosine %.6f (worst position %.6f), loss %.6f vs transformers %.6f\n",
           name, what[mutation], *all, *worst, loss, ref.loss);

    cuda_model_free(m);
    attn_mask_free(&mask);
    cudaCheck(cudaFree(params_f32_dev));
    cudaCheck(cudaFree(params_dev));
    hf_reference_free(&ref);
    free(logits), free(params);
    param_table_free(&table);
}

int main(void) {
    SKIP_WITHOUT_CUDA_DEVICE();
    ops_cuda_init(ROW, MAX_CHANNELS);
    static const char *const FIXTURES[] = {"llama_linear_f16", "qwen2_bias_bf16",
                                           "qwen3_qknorm_sharded"};
    double worst, all, loss_err;
    for (int f = 0; f < 3; f++) {
        fixture_cosines(FIXTURES[f], AS_STORED, &worst, &all, &loss_err);
        EXPECT(all >= 0.999 && worst >= 0.999, "%s: logits cosine %.6f, worst position %.6f",
               FIXTURES[f], all, worst);
        EXPECT(loss_err <= 5e-3, "%s: loss relative error %.3g", FIXTURES[f], loss_err);
    }
    fixture_cosines("llama_linear_f16", PLAIN_ROPE, &worst, &all, &loss_err);
    EXPECT(all < 0.999, "plain RoPE on the linear-scaled fixture: logits cosine %.6f", all);
    fixture_cosines("qwen3_qknorm_sharded", UNIT_QK_NORM, &worst, &all, &loss_err);
    EXPECT(all < 0.999, "unit q_norm/k_norm weights on Qwen3: logits cosine %.6f", all);
    ops_cuda_destroy();
    return test_finish();
}
