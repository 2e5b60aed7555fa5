// The CUDA trainer tests' common start: a 2-layer model (hidden 128, 2 heads, 1 kv head,
// untied, the MLP's width given) over the default config's tokenizer, the synthetic training set packed under
// duplicate into micro-batches, random weights, and AdamW moments of a run in progress
// (random m and v at a random step). Include after trainer/setup.h,
// trainer/data_options.h and tests/test_util.h.
#pragma once

struct TrainFixture {
    RunConfig *config;
    Tokenizer *tok;
    ModelConfig mc;
    PackedDataset data;
    MicroBatches micro;
    long long tokens, trained;  // the rows' tokens and trained tokens
    ParamTable table;
    size_t n;                   // table.total
    float *params;              // [n]
    AdamWState opt;             // [n] m and v
};

static void train_fixture_load(TrainFixture *f, TestRng *rng, int seq_len, int micro_rows,
                               int conversations, int intermediate_size) {
    char mlp_width[64];
    snprintf(mlp_width, sizeof mlp_width, "model.intermediate_size=%d", intermediate_size);
    const char *overrides[] = {"model.hidden_size=128", "model.num_attention_heads=2",
                               "model.num_key_value_heads=1", mlp_width,
                               "model.num_hidden_layers=2", "model.tie_word_embeddings=false"};
    f->config = config_load(NULL, 6, (char **)overrides);
    f->tok = tokenizer_with_added(f->config);
    f->mc = model_config_with(f->config, f->tok);
    DataOptions opt_data = data_options_from_config(f->config);
    opt_data.layout = LAYOUT_DUPLICATE;
    opt_data.seq_len = seq_len;
    opt_data.max_samples = conversations;
    packed_dataset_load(f->tok, "datasets/synthetic/train.jsonl", opt_data, &f->data);
    micro_batches_build(&f->data.rows, micro_rows, &f->micro);
    packed_rows_count(&f->data.rows, &f->tokens, &f->trained);
    param_table_build(&f->mc, &f->table);
    f->n = f->table.total;
    f->params = (float *)xmalloc(f->n * sizeof(float));
    params_init(&f->mc, &f->table, test_rng_next(rng), f->params);
    adamw_init(&f->opt, f->n);
    for (size_t i = 0; i < f->n; i++) {
        f->opt.m[i] = 1e-3f * test_rng_uniform(rng);
        f->opt.v[i] = 1e-6f * (1.0f + test_rng_uniform(rng));
    }
    f->opt.step = test_rng_int(rng, 1, 50);
}

static void train_fixture_free(TrainFixture *f) {
    free(f->params);
    adamw_free(&f->opt);
    param_table_free(&f->table);
    micro_batches_free(&f->micro);
    packed_dataset_free(&f->data);
    tokenizer_free(f->tok);
    config_free(f->config);
}
