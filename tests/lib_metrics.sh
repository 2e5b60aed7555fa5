# Shared by the CLI tests that compare metrics.jsonl files (sourced; not a test itself).
# untimed FILE...: the lines without the fields that depend on the clock or the device
# (tokens/s, the npass-equivalent rate, elapsed seconds, MFU, GPU memory).
untimed() {
    sed -E 's/"tokens_per_s":[^,]*,//; s/"npass_equivalent_tokens_per_s":[^,]*,//; s/"elapsed_s":[^,]*,//;
            s/"mfu":[^,}]*//; s/,"gpu_memory_gib":[^,}]*//' "$@"
}
