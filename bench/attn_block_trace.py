#!/usr/bin/env python3
"""Where a dK/dV block's time goes: a diagnostic build of the attention backward and its report.

`apply` instruments a scratch copy of the tree (a worktree, never main): the dK/dV kernel
records per block its SM, `%globaltimer` and `clock64` at entry, after step 0's tiles have
landed (warpgroup 0), at the walk's end, and after each warpgroup's dK/dV stores; and
bench_attention, when TRACE_DIR is set, runs one warm fast and one deterministic backward
of each causal shape with the recording on and writes TRACE_DIR/trace_S<S>_H<H>_D<D>_<mode>.txt.
`report` turns those files into the prologue / loop / epilogue / gap split per block and
the share of each SM's time (docs/KERNELS.md has a table of it).

    python3 bench/attn_block_trace.py apply TREE
    (build bench_attention in TREE, bundle it: bench/device_bundle.sh; on the GPU machine:
     TRACE_DIR=$OUT/t bench_attention 16384 4096 causal)
    python3 bench/attn_block_trace.py report trace_*.txt

`apply` stops, naming the piece of source it looks for, when the kernel has changed under it.
"""
import collections
import os
import sys

MARK = "g_dkdv_trace"

BWD_EDITS = [
    (  # the record and its host dump
        "namespace {\n\n// ---------------------------------------------------------------- params and workspace",
        "__device__ unsigned long long g_dkdv_trace[65536][8];  // per block: sm, steps, gtime, entry, first, end, exit0, exit1\n"
        "__device__ int g_dkdv_trace_on;\n"
        "__device__ __forceinline__ unsigned long long trace_gtime() {\n"
        "    unsigned long long t;\n"
        "    asm volatile(\"mov.u64 %0, %globaltimer;\" : \"=l\"(t));\n"
        "    return t;\n"
        "}\n"
        "__device__ __forceinline__ unsigned trace_smid() {\n"
        "    unsigned r;\n"
        "    asm volatile(\"mov.u32 %0, %smid;\" : \"=r\"(r));\n"
        "    return r;\n"
        "}\n"
        "namespace {\n\n// ---------------------------------------------------------------- params and workspace",
    ),
    (  # consumer: step 0's tiles landed
        "    const AttnDims &d = p.dims;\n    const int key_row = (blk.k_tile0 + wg) * BN + warp_row();",
        "    const AttnDims &d = p.dims;\n"
        "    const bool tr = g_dkdv_trace_on && threadIdx.x % NUM_THREADS == 0 && blockIdx.x < 65536;\n"
        "    mbar_wait(&smem.full[0], 0);\n"
        "    if (tr && wg == 0) g_dkdv_trace[blockIdx.x][4] = clock64();\n"
        "    const int key_row = (blk.k_tile0 + wg) * BN + warp_row();",
    ),
    (  # consumer: the walk's end
        "    if constexpr (ATOMIC_DQ) {\n        if (n > 0 && dq_owner(n - 1, wg)) {\n            float dq_part[D / 8][4];",
        "    if (tr && wg == 0) {\n"
        "        g_dkdv_trace[blockIdx.x][5] = clock64();\n"
        "        g_dkdv_trace[blockIdx.x][1] = n;\n"
        "    }\n"
        "    if constexpr (ATOMIC_DQ) {\n        if (n > 0 && dq_owner(n - 1, wg)) {\n            float dq_part[D / 8][4];",
    ),
    (  # consumer: after the stores
        "    store_dk_dv<D>(p, blk, key_row, dk_acc, dv_acc);\n}",
        "    store_dk_dv<D>(p, blk, key_row, dk_acc, dv_acc);\n"
        "    if (tr) g_dkdv_trace[blockIdx.x][6 + wg] = clock64();\n}",
    ),
    (  # kernel entry
        "    const int wg = __shfl_sync(0xffffffff, threadIdx.x / NUM_THREADS, 0);\n\n"
        "    if (threadIdx.x == 0) {\n#pragma unroll\n        for (int s = 0; s < STAGES; s++) {",
        "    const int wg = __shfl_sync(0xffffffff, threadIdx.x / NUM_THREADS, 0);\n"
        "    if (g_dkdv_trace_on && threadIdx.x == 0 && blockIdx.x < 65536) {\n"
        "        g_dkdv_trace[blockIdx.x][0] = trace_smid();\n"
        "        g_dkdv_trace[blockIdx.x][2] = trace_gtime();\n"
        "        g_dkdv_trace[blockIdx.x][3] = clock64();\n"
        "    }\n\n"
        "    if (threadIdx.x == 0) {\n#pragma unroll\n        for (int s = 0; s < STAGES; s++) {",
    ),
]

BWD_TAIL = r'''
// Diagnostic (bench/attn_block_trace.py): on = 1 clears the record and turns it on; on = 0
// turns it off and writes the blocks it holds to path, one line each.
extern "C" void attn_bwd_trace(int on, const char *path) {
    static unsigned long long host[65536][8];
    cudaDeviceSynchronize();
    cudaMemcpyToSymbol(g_dkdv_trace_on, &on, sizeof on);
    if (on) {
        memset(host, 0, sizeof host);
        cudaMemcpyToSymbol(g_dkdv_trace, host, sizeof host);
        return;
    }
    cudaMemcpyFromSymbol(host, g_dkdv_trace, sizeof host);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "attn_bwd_trace: cannot write %s\n", path);
        exit(1);
    }
    for (int i = 0; i < 65536; i++)
        if (host[i][2])
            fprintf(f, "%d %llu %llu %llu %llu %llu %llu %llu %llu\n", i, host[i][0], host[i][1], host[i][2],
                    host[i][3], host[i][4], host[i][5], host[i][6], host[i][7]);
    fclose(f);
}
'''

BENCH_EDITS = [
    (
        "void bench_size(const Heads &hd",
        'extern "C" void attn_bwd_trace(int on, const char *path);\nvoid bench_size(const Heads &hd',
    ),
    (
        "        const float t_fwd = median_ms(fwd);",
        "        if (getenv(\"TRACE_DIR\") && kind == 0) {  // causal: one warm backward per mode, recorded\n"
        "            for (int det = 0; det < 2; det++) {\n"
        "                for (int r = 0; r < 5; r++) fwdbwd(det);\n"
        "                fwd();\n"
        "                attn_bwd_trace(1, NULL);\n"
        "                attention_backward_cuda(&shape, &mask, q, k, v, out, lse, dout, dq, dk, dv, det, workspace, 0);\n"
        "                char path[512];\n"
        "                snprintf(path, sizeof path, \"%s/trace_S%d_H%d_D%d_%s.txt\", getenv(\"TRACE_DIR\"), S, H, D,\n"
        "                         det ? \"det\" : \"fast\");\n"
        "                attn_bwd_trace(0, path);\n"
        "            }\n"
        "        }\n"
        "        const float t_fwd = median_ms(fwd);",
    ),
]


def edit(path, edits, tail=""):
    with open(path) as f:
        src = f.read()
    if MARK in src:
        sys.exit(f"attn_block_trace: {path} is instrumented already")
    for old, new in edits:
        if src.count(old) != 1:
            first = old.strip().splitlines()[0]
            sys.exit(f"attn_block_trace: {path}: expected once, found {src.count(old)} times: {first!r}")
        src = src.replace(old, new)
    with open(path, "w") as f:
        f.write(src + tail)


def apply(tree):
    bwd = os.path.join(tree, "attention", "attention_bwd.cu")
    bench = os.path.join(tree, "bench", "bench_attention.cu")
    edit(bwd, BWD_EDITS, BWD_TAIL)
    edit(bench, BENCH_EDITS)
    print(f"instrumented {bwd} and {bench}")


def report(paths):
    mean = lambda xs: sum(xs) / max(len(xs), 1)
    for path in paths:
        rows = []
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                fields = line.split()
                if len(fields) != 9:
                    sys.exit(f"{path}:{lineno}: expected 9 fields (block, sm, steps, gtime, entry, first, "
                             f"end, exit0, exit1), got {len(fields)}")
                rows.append([int(x) for x in fields])
        if not rows:
            sys.exit(f"{path}: no blocks recorded")
        by_sm = collections.defaultdict(list)
        for r in rows:
            by_sm[r[1]].append(r)
        prologue, loop, epilogue, gaps, spans = [], [], [], [], []
        steps = 0
        for blocks in by_sm.values():  # clock64 is per SM: compare only inside one
            blocks.sort(key=lambda r: r[4])
            for r in blocks:
                prologue.append(r[5] - r[4])
                loop.append(r[6] - r[5])
                epilogue.append(max(r[7], r[8]) - r[6])
                steps += r[2]
            gaps += [b[4] - max(a[7], a[8]) for a, b in zip(blocks, blocks[1:])]
            spans.append(max(blocks[-1][7], blocks[-1][8]) - blocks[0][4])
        total = sum(prologue) + sum(loop) + sum(epilogue) + sum(gaps)
        print(f"{path}: {len(rows)} blocks on {len(by_sm)} SMs, {steps} steps")
        print(f"  cycles per block: prologue {mean(prologue):.0f}, loop {mean(loop):.0f} "
              f"({sum(loop) / max(steps, 1):.0f} per step), epilogue {mean(epilogue):.0f}, "
              f"gap to the next block {mean(gaps):.0f}")
        print(f"  share of the SMs' time: prologue {100 * sum(prologue) / total:.1f}%, "
              f"epilogue {100 * sum(epilogue) / total:.1f}%, gaps {100 * sum(gaps) / total:.1f}%")
        print(f"  per-SM span: min {min(spans)}, mean {mean(spans):.0f}, max {max(spans)} cycles")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "apply":
        apply(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "report":
        report(sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
