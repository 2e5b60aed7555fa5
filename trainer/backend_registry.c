// The backend registry (trainer/backend_registry.h).
#include "trainer/backend_registry.h"

#include <stdio.h>
#include <string.h>

#include "common/check.h"
#include "trainer/backend_cpu.h"
#ifdef ONEPASS_HAVE_CUDA
#include "model/model_cuda.h"
#include "trainer/backend_cuda.h"
#endif

Backend backend_choose(const char *name, const ModelConfig *mc, char *why, size_t why_len) {
    if (!name) fatal("config key 'backend': must be \"auto\", \"cpu\" or \"cuda\", got null");
    const bool want_cuda = strcmp(name, "cuda") == 0, want_auto = strcmp(name, "auto") == 0;
    if (strcmp(name, "cpu") == 0) {
        snprintf(why, why_len, "backend: cpu (requested)");
        return BACKEND_CPU;
    }
    if (!want_cuda && !want_auto)
        fatal("config key 'backend': must be \"auto\", \"cpu\" or \"cuda\", got \"%s\"", name);
#ifdef ONEPASS_HAVE_CUDA
    char device[256] = "";
    const int n_devices = cuda_device_count(device, sizeof device);
    if (n_devices == 0) {
        if (want_cuda)
            fatal("config key 'backend': \"cuda\" requested but no CUDA device was found");
        snprintf(why, why_len, "backend: cpu (no CUDA device found)");
        return BACKEND_CPU;
    }
    const ModelDims dims = model_dims(mc);  // fatal, naming the model.* key, on a bad config
    if (want_auto && !model_dims_cuda_supported(&dims)) {
        snprintf(why, why_len, "backend: cpu (a CUDA device is visible, but the CUDA kernels need "
                 "head_dim 64 or 128 and model.hidden_size / model.num_attention_heads is %d / %d)",
                 mc->hidden_size, mc->num_attention_heads);
        return BACKEND_CPU;
    }
    snprintf(why, why_len, "backend: cuda (%s; %d CUDA device%s visible, using device 0: %s)",
             want_cuda ? "requested" : "auto", n_devices, n_devices == 1 ? "" : "s", device);
    return BACKEND_CUDA;
#else
    (void)mc;
    if (want_cuda)
        fatal("config key 'backend': \"cuda\" requested but this binary was built without CUDA");
    snprintf(why, why_len, "backend: cpu (built without CUDA)");
    return BACKEND_CPU;
#endif
}

const TrainBackendOps *backend_ops(Backend backend) {
#ifdef ONEPASS_HAVE_CUDA
    if (backend == BACKEND_CUDA) return cuda_train_backend();
#endif
    CHECK(backend == BACKEND_CPU, "backend %d is not in this binary", (int)backend);
    return cpu_train_backend();
}

AttnWorkspaceBytes backend_attention_workspace(void) {
#ifdef ONEPASS_HAVE_CUDA
    return cuda_model_attention_workspace_bytes;
#else
    return NULL;
#endif
}
