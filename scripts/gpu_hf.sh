#!/usr/bin/env bash
# One device call for issue 10 on the GPU machine (PyTorch + transformers, no internet):
#  1. the CUDA tests of the new ops and architectures: test_ops_cuda (scaled RoPE, Linear
#     biases, rmsnorm on the q_norm shape [T*H, 128]) and test_model_cuda (Qwen2 biases,
#     llama3 scaling, head_dim decoupled from hidden/heads, against the CPU model);
#  2. HF fixtures of CUDA shapes (scripts/make_hf_fixtures.py --cuda-shapes: head_dim 64,
#     Qwen3's 128; built there by transformers; test_hf_model_cuda checks the committed
#     ones' logits), each fine-tuned from model.init_from for
#     one step at lr 0 on the CUDA backend with an eval after it, exported with `train export`, and the export loaded by
#     AutoModelForCausalLM.from_pretrained: its loss on the same packed eval rows (position
#     ids, [lo, hi) as a 4-D mask; scripts/hf_compare.py) against onepass's eval loss,
#     within 5e-3 relative (bf16 on CUDA against fp32 transformers).
# Usage, from the repository root here:
#   scripts/test.sh   (or: cmake -S . -B build -DONEPASS_CUDA=ON && cmake --build build -j2)
#   scripts/device_bundle.sh build .device/hf test_ops_cuda test_model_cuda test_hf_model_cuda train  (~47 MiB)
#   then the device call: command "bash scripts/gpu_hf.sh", carry [".device/hf"]
# Results: $OUT/hf.tar.gz (logs) and the summary lines on stdout.
set -u
out=/tmp/hf_out; mkdir -p "$out"
bin=${BIN:-.device/hf}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/info.log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/info.log"

for t in test_ops_cuda test_model_cuda test_hf_model_cuda; do
  $bin/$t > "$out/$t.log" 2>&1; echo "$t rc=$? $(tail -1 "$out/$t.log")"; grep FAIL "$out/$t.log" | head -5
done

python3 scripts/make_hf_fixtures.py --cuda-shapes --out "$out/fixtures" > "$out/fixtures.log" 2>&1 \
  || { echo "fixtures failed: $(tail -3 "$out/fixtures.log")"; }
bash scripts/hf_roundtrip.sh "$bin/train" "$out/fixtures" "$out/runs" cuda

tar -C /tmp -czf "${OUT:-/tmp}/hf.tar.gz" hf_out
