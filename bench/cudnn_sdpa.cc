// cuDNN SDPA forward through the backend API, the graph that cudnn-frontend's SDPA
// node expands to (cuDNN 9: matmul, scale, causal mask
// from generated row/column indices, softmax with stats, matmul), which cuDNN's fused
// flash-attention engine recognises. Every cuDNN entry point comes from dlopen.
#include "bench/cudnn_sdpa.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <cudnn.h>
#include <initializer_list>
#include <utility>
#include <vector>

namespace {

// The entry points the graph needs (declared in <cudnn_graph.h>, resolved at run time).
struct CudnnApi {
    decltype(&cudnnGetVersion) get_version;
    decltype(&cudnnCreate) create;
    decltype(&cudnnDestroy) destroy;
    decltype(&cudnnSetStream) set_stream;
    decltype(&cudnnGetErrorString) error_string;
    decltype(&cudnnGetLastErrorString) last_error;
    decltype(&cudnnBackendCreateDescriptor) create_desc;
    decltype(&cudnnBackendDestroyDescriptor) destroy_desc;
    decltype(&cudnnBackendSetAttribute) set;
    decltype(&cudnnBackendGetAttribute) get;
    decltype(&cudnnBackendFinalize) finalize;
    decltype(&cudnnBackendExecute) execute;
};

// Loads libcudnn once; NULL (why filled) when it is missing.
const CudnnApi *cudnn_api(char *why, size_t why_len) {
    static CudnnApi api;
    static int state = 0;  // 0 not tried, 1 loaded, -1 failed
    static char failure[256];
    if (state == 0) {
        state = -1;
        void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            snprintf(failure, sizeof failure, "dlopen libcudnn.so.9: %s", dlerror());
        } else {
            const struct {
                void *slot;  // a CudnnApi member
                const char *name;
            } symbols[] = {{&api.get_version, "cudnnGetVersion"},
                           {&api.create, "cudnnCreate"},
                           {&api.destroy, "cudnnDestroy"},
                           {&api.set_stream, "cudnnSetStream"},
                           {&api.error_string, "cudnnGetErrorString"},
                           {&api.last_error, "cudnnGetLastErrorString"},
                           {&api.create_desc, "cudnnBackendCreateDescriptor"},
                           {&api.destroy_desc, "cudnnBackendDestroyDescriptor"},
                           {&api.set, "cudnnBackendSetAttribute"},
                           {&api.get, "cudnnBackendGetAttribute"},
                           {&api.finalize, "cudnnBackendFinalize"},
                           {&api.execute, "cudnnBackendExecute"}};
            bool ok = true;
            for (const auto &sym : symbols) {
                void *fn = dlsym(lib, sym.name);
                if (!fn && ok) snprintf(failure, sizeof failure, "libcudnn.so.9 lacks %s", sym.name);
                ok = ok && fn;
                memcpy(sym.slot, &fn, sizeof fn);  // function pointer from dlsym's object pointer
            }
            if (ok) state = 1;
        }
    }
    if (state == 1) return &api;
    snprintf(why, why_len, "%s", failure);
    return NULL;
}

enum Uid : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_VIRTUAL };

// Builds descriptors, remembering every one for destruction and the first failure.
struct Builder {
    const CudnnApi *api;
    std::vector<cudnnBackendDescriptor_t> owned;
    char error[512] = "";
    int64_t next_virtual = UID_VIRTUAL;

    bool failed() const { return error[0] != 0; }
    // Records the first failure of `what` with cuDNN's own message.
    void check(cudnnStatus_t st, const char *what) {
        if (st == CUDNN_STATUS_SUCCESS || failed()) return;
        char detail[256] = "";
        api->last_error(detail, sizeof detail);
        snprintf(error, sizeof error, "%s: %s %s", what, api->error_string(st), detail);
    }
    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
        cudnnBackendDescriptor_t d = NULL;
        check(api->create_desc(type, &d), "create descriptor");
        if (d) owned.push_back(d);
        return d;
    }
    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
             int64_t n, const void *value) {
        if (!failed()) check(api->set(d, name, type, n, value), "set attribute");
    }
    void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
        set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
    }
    void set_type(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnDataType_t t) {
        set(d, name, CUDNN_TYPE_DATA_TYPE, 1, &t);
    }
    void finalize(cudnnBackendDescriptor_t d, const char *what) {
        if (!failed()) check(api->finalize(d), what);
    }

    // A 4-D tensor; uid 0 makes it virtual (an intermediate that never reaches memory).
    cudnnBackendDescriptor_t tensor(cudnnDataType_t type, const int64_t dims[4], const int64_t strides[4],
                                    int64_t uid = 0, bool by_value = false) {
        cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        const bool is_virtual = uid == 0;
        if (is_virtual) uid = next_virtual++;
        const int64_t alignment = 16;
        set_type(t, CUDNN_ATTR_TENSOR_DATA_TYPE, type);
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
        set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
        if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
        finalize(t, "tensor");
        return t;
    }
    // An operation node of `type` with the (attribute, descriptor) pairs given (NULL ones
    // left out), not finalized.
    cudnnBackendDescriptor_t operation(
        cudnnBackendDescriptorType_t type,
        std::initializer_list<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>> attrs) {
        cudnnBackendDescriptor_t op = make(type);
        for (const auto &attr : attrs)
            if (attr.second) set_desc(op, attr.first, attr.second);
        return op;
    }
    cudnnBackendDescriptor_t matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                    cudnnBackendDescriptor_t c) {
        cudnnBackendDescriptor_t desc = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        set_type(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
        finalize(desc, "matmul descriptor");
        cudnnBackendDescriptor_t op =
            operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
                      {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a}, {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
                       {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c}, {CUDNN_ATTR_OPERATION_MATMUL_DESC, desc}});
        finalize(op, "matmul");
        return op;
    }
    // y = mode(x[, b[, t]]); axis only for GEN_INDEX.
    cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math,
                                       cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t x,
                                       cudnnBackendDescriptor_t b = NULL, cudnnBackendDescriptor_t t = NULL,
                                       int64_t axis = -1) {
        cudnnBackendDescriptor_t desc = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        set(desc, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
        set_type(desc, CUDNN_ATTR_POINTWISE_MATH_PREC, math);
        if (axis >= 0) set(desc, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
        finalize(desc, "pointwise descriptor");
        cudnnBackendDescriptor_t op = operation(
            CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
            {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc}, {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x},
             {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b}, {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t},
             {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y}});
        const float one = 1.0f;
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
        finalize(op, "pointwise");
        return op;
    }
    cudnnBackendDescriptor_t reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t y,
                                       cudnnBackendDescriptor_t x) {
        cudnnBackendDescriptor_t desc = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        set(desc, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
        set_type(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
        finalize(desc, "reduction descriptor");
        cudnnBackendDescriptor_t op = operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                                                {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x},
                                                 {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y},
                                                 {CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc}});
        finalize(op, "reduction");
        return op;
    }
};

}  // namespace

struct CudnnSdpa {
    const CudnnApi *api;
    cudnnHandle_t handle;
    Builder *builder;  // owns every descriptor, the plan included
    cudnnBackendDescriptor_t plan;
    void *workspace;
    float scale, neg_inf;  // the by-value scalars' storage
};

CudnnSdpa *cudnn_sdpa_create(int S, int H, int KV, int D, float scale, char *why, size_t why_len) {
    const CudnnApi *api = cudnn_api(why, why_len);
    if (!api) return NULL;
    CudnnSdpa *s = new CudnnSdpa{api, NULL, new Builder{api, {}}, NULL, NULL, scale, -INFINITY};
    Builder &g = *s->builder;
    g.check(api->create(&s->handle), "cudnnCreate");

    // Logical dims (b, h, rows, cols) over the [1, S, heads, D] row-major buffers.
    const int64_t s_ = S, h = H, kv = KV, d = D;
    const int64_t q_dims[4] = {1, h, s_, d}, q_strides[4] = {s_ * h * d, d, h * d, 1};
    const int64_t kt_dims[4] = {1, kv, d, s_}, kt_strides[4] = {s_ * kv * d, d, 1, kv * d};
    const int64_t v_dims[4] = {1, kv, s_, d}, v_strides[4] = {s_ * kv * d, d, kv * d, 1};
    const int64_t ss_dims[4] = {1, h, s_, s_}, ss_strides[4] = {h * s_ * s_, s_ * s_, s_, 1};
    const int64_t row_dims[4] = {1, h, s_, 1}, row_strides[4] = {h * s_, s_, 1, 1};
    const int64_t one[4] = {1, 1, 1, 1};
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16;

    auto q = g.tensor(BF, q_dims, q_strides, UID_Q), kt = g.tensor(BF, kt_dims, kt_strides, UID_K);
    auto v = g.tensor(BF, v_dims, v_strides, UID_V), o = g.tensor(BF, q_dims, q_strides, UID_O);
    auto stats = g.tensor(F, row_dims, row_strides, UID_STATS);
    auto scale_t = g.tensor(F, one, one, UID_SCALE, true), neg_inf = g.tensor(F, one, one, UID_NEG_INF, true);
    auto scores = g.tensor(F, ss_dims, ss_strides), scaled = g.tensor(F, ss_dims, ss_strides);
    auto row = g.tensor(CUDNN_DATA_INT32, ss_dims, ss_strides), col = g.tensor(CUDNN_DATA_INT32, ss_dims, ss_strides);
    auto visible = g.tensor(CUDNN_DATA_BOOLEAN, ss_dims, ss_strides), masked = g.tensor(F, ss_dims, ss_strides);
    auto row_max = g.tensor(F, row_dims, row_strides), shifted = g.tensor(F, ss_dims, ss_strides);
    auto exps = g.tensor(F, ss_dims, ss_strides), row_sum = g.tensor(F, row_dims, row_strides);
    auto log_sum = g.tensor(F, row_dims, row_strides), probs = g.tensor(BF, ss_dims, ss_strides);

    std::vector<cudnnBackendDescriptor_t> ops = {
        g.matmul(q, kt, scores),
        g.pointwise(CUDNN_POINTWISE_MUL, F, scaled, scores, scale_t),
        g.pointwise(CUDNN_POINTWISE_GEN_INDEX, F, row, scaled, NULL, NULL, 2),
        g.pointwise(CUDNN_POINTWISE_GEN_INDEX, F, col, scaled, NULL, NULL, 3),
        g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, visible, row, col),  // causal: q >= k
        g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, F, masked, scaled, neg_inf, visible),
        g.reduction(CUDNN_REDUCE_TENSOR_MAX, row_max, masked),
        g.pointwise(CUDNN_POINTWISE_SUB, F, shifted, masked, row_max),
        g.pointwise(CUDNN_POINTWISE_EXP, F, exps, shifted),
        g.reduction(CUDNN_REDUCE_TENSOR_ADD, row_sum, exps),
        g.pointwise(CUDNN_POINTWISE_LOG, F, log_sum, row_sum),
        g.pointwise(CUDNN_POINTWISE_ADD, F, stats, row_max, log_sum),
        g.pointwise(CUDNN_POINTWISE_DIV, F, probs, exps, row_sum),
        g.matmul(probs, v, o),
    };
    cudnnBackendDescriptor_t graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data());
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &s->handle);
    g.finalize(graph, "operation graph");

    // Heuristics, then the first engine configuration that makes a plan.
    cudnnBackendDescriptor_t heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    g.set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    g.finalize(heur, "heuristics");
    int64_t n_configs = 0;
    if (!g.failed())
        g.check(api->get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n_configs, NULL),
                "heuristics count");
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < n_configs && !g.failed(); i++) configs.push_back(g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    if (!g.failed() && n_configs > 0)
        g.check(api->get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_configs, &n_configs,
                         configs.data()),
                "heuristics results");
    char plan_error[512] = "no engine configuration";
    for (int64_t i = 0; i < n_configs && !g.failed() && !s->plan; i++) {
        cudnnBackendDescriptor_t plan = g.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        g.set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &s->handle);
        g.set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i]);
        g.finalize(plan, "execution plan");
        if (g.failed()) {  // this engine declines the graph: try the next one
            snprintf(plan_error, sizeof plan_error, "%s", g.error);
            g.error[0] = 0;
        } else {
            s->plan = plan;
        }
    }
    if (!g.failed() && !s->plan) snprintf(g.error, sizeof g.error, "%s", plan_error);
    int64_t workspace_bytes = 0;
    if (!g.failed())
        g.check(api->get(s->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, NULL,
                         &workspace_bytes),
                "workspace size");
    if (!g.failed() && workspace_bytes > 0 && cudaMalloc(&s->workspace, workspace_bytes) != cudaSuccess)
        snprintf(g.error, sizeof g.error, "cudaMalloc of %lld workspace bytes", (long long)workspace_bytes);
    if (g.failed()) {
        snprintf(why, why_len, "cuDNN %zu: %s", api->get_version(), g.error);
        cudnn_sdpa_destroy(s);
        return NULL;
    }
    return s;
}

int cudnn_sdpa_run(CudnnSdpa *s, const void *q, const void *k, const void *v, void *out, float *stats,
                   cudaStream_t stream, char *why, size_t why_len) {
    Builder &g = *s->builder;
    g.check(s->api->set_stream(s->handle, stream), "cudnnSetStream");
    const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, out, stats, &s->scale, &s->neg_inf};
    cudnnBackendDescriptor_t pack = NULL;
    if (!g.failed()) g.check(s->api->create_desc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "variant pack");
    if (pack) {
        g.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 7, uids);
        g.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 7, ptrs);
        g.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &s->workspace);
        g.finalize(pack, "variant pack");
        if (!g.failed()) g.check(s->api->execute(s->handle, s->plan, pack), "execute");
        s->api->destroy_desc(pack);
    }
    if (!g.failed()) return 0;
    snprintf(why, why_len, "%s", g.error);
    return -1;
}

void cudnn_sdpa_destroy(CudnnSdpa *s) {
    if (!s) return;
    for (auto it = s->builder->owned.rbegin(); it != s->builder->owned.rend(); ++it) s->api->destroy_desc(*it);
    if (s->handle) s->api->destroy(s->handle);
    if (s->workspace) cudaFree(s->workspace);
    delete s->builder;
    delete s;
}
