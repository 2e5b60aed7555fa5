// model.add_tokens from a model folder (cli_add_tokens.sh runs the commands): a random
// untied model of the chatml fixture tokenizer's 1504 rows, or of 1536 (padding rows),
// loaded with the qwen3 template's missing tokens added. The new ids' rows of the embedding
// and of lm_head, read back from the exported model.safetensors, equal the mean of the
// source rows computed here; every other row is the source's; the exported tokenizer gives
// each token the id the reference `tokenizers` gave it (tests/data/add_tokens,
// scripts/fixtures/make_add_tokens_fixture.py), and a tokenizer_config.json's
// added_tokens_decoder names it under that id.
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "data/tokenizer.h"
#include "model/hf_export.h"
#include "model/hf_model.h"
#include "model/safetensors.h"
#include "tests/test_model_util.h"
#include "tests/test_util.h"
#include "trainer/config.h"
#include "trainer/setup.h"

#define CHATML "tests/data/templates/chatml"
#define REFERENCE "tests/data/add_tokens/tokenizer.json"
static const char *const ADDED[] = {"<think>", "</think>", "<tool_call>", "</tool_call>",
                                    "<tool_response>", "</tool_response>"};
enum { N_ADDED = 6, LOADED = 1504, GROWN = 1508, C = 16 };

static void write_folder(const char *dir, const ParamTable *table, const float *params,
                         const ModelConfig *mc) {
    char err[1024];
    HfExport e = {.hf = {.cfg = *mc, .bos_token_id = -1, .pad_token_id = -1}, .dtype = SAVE_F32,
                  .generation_eos_token_id = -1};
    CHECK(hf_export_write(dir, table, params, &e, err, sizeof err) == 0, "%s", err);
}

// One source vocabulary size: source rows random, the added rows checked after export.
static void check_source(int source_vocab, const char *root, TestRng *rng) {
    char src[512], out[512], err[1024];
    snprintf(src, sizeof src, "%s/src%d", root, source_vocab);
    snprintf(out, sizeof out, "%s/out%d", root, source_vocab);
    ModelConfig smc = test_model_config(source_vocab, C, 32, 1, 2, 1);
    ParamTable st;
    param_table_build(&smc, &st);
    float *sp = xmalloc(st.total * sizeof(float));  // [st.total]
    for (size_t i = 0; i < st.total; i++) sp[i] = test_rng_uniform(rng);
    write_folder(src, &st, sp, &smc);

    char init_from[600];
    snprintf(init_from, sizeof init_from, "model.init_from=%s", src);
    char *sets[] = {init_from, "data.tokenizer=" CHATML, "data.chat_template=qwen3",
                    "model.add_tokens=[\"<think>\",\"</think>\",\"<tool_call>\",\"</tool_call>\","
                    "\"<tool_response>\",\"</tool_response>\"]"};
    RunConfig *c = config_load(NULL, 4, sets);
    Tokenizer *tok = tokenizer_with_added(c);
    const ModelConfig mc = model_config_with(c, tok);
    const int vocab = source_vocab > GROWN ? source_vocab : GROWN;
    EXPECT(mc.vocab_size == vocab, "vocab %d, want %d (source %d)", mc.vocab_size, vocab, source_vocab);
    EXPECT(tokenizer_loaded_size(tok) == LOADED && tokenizer_vocab_size(tok) == GROWN, "sizes %d %d",
           tokenizer_loaded_size(tok), tokenizer_vocab_size(tok));
    ParamTable table;
    param_table_build(&mc, &table);
    float *params = xmalloc(table.total * sizeof(float));  // [table.total]
    params_load_or_init(&mc, &table, src, 0, params);
    params_init_added_rows(&mc, &table, tok, src, params);
    write_folder(out, &table, params, &mc);
    // A tokenizer_config.json with an added_tokens_decoder (transformers writes one) gets
    // the tokens too.
    char config_path[700];
    snprintf(config_path, sizeof config_path, "%s/tokenizer_config.json", out);
    json_t *decoder = json_pack("{s:{s:{s:s, s:b}}}", "added_tokens_decoder", "1502", "content",
                                "<|im_start|>", "special", 1);
    CHECK(hf_copy_tokenizer(NULL, CHATML, out, err, sizeof err) == 0 &&
          json_dump_file(decoder, config_path, 0) == 0 &&
          hf_write_added_tokens(out, tok, err, sizeof err) == 0, "%s", err);
    json_decref(decoder);
    json_t *written = json_load_file(config_path, 0, NULL);
    const json_t *entries = json_object_get(written, "added_tokens_decoder");
    EXPECT(json_object_size(entries) == 1 + N_ADDED, "added_tokens_decoder has %zu entries",
           json_object_size(entries));

    // The exported rows against the source's, and the mean row computed here.
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    SafeTensorsFile f;
    CHECK(safetensors_read(path, &f, err, sizeof err) == 0, "%s", err);
    const char *names[] = {"model.embed_tokens.weight", "lm_head.weight"};
    for (int k = 0; k < 2; k++) {
        const ParamTensor *from = param_table_find(&st, names[k]);
        const int64_t shape[2] = {vocab, C};
        float *w = xmalloc((size_t)vocab * C * sizeof(float));  // [vocab, C]
        EXPECT(safetensors_copy_f32(&f, names[k], 2, shape, w, err, sizeof err) == 0, "%s", err);
        const float *old = sp + from->offset;  // [source_vocab, C]
        double mean[C] = {0};
        for (int r = 0; r < source_vocab; r++)
            for (int j = 0; j < C; j++) mean[j] += old[r * C + j] / source_vocab;
        double worst = 0;
        int kept = 0;
        for (int r = 0; r < vocab; r++) {
            const bool added = r >= LOADED && r < GROWN;
            if (added) {
                for (int j = 0; j < C; j++) worst = fmax(worst, fabs(w[r * C + j] - mean[j]));
            } else if (r < source_vocab) {
                kept += memcmp(w + r * C, old + r * C, C * sizeof(float)) == 0;
            }
        }
        EXPECT(worst < 1e-6, "%s (source %d): added rows differ from the mean row by %g", names[k],
               source_vocab, worst);
        const int taken = (source_vocab < GROWN ? source_vocab : GROWN) - LOADED;  // source rows of new ids
        EXPECT(kept == source_vocab - taken, "%s (source %d): %d source rows kept", names[k],
               source_vocab, kept);
        free(w);
    }
    safetensors_file_free(&f);

    // The exported tokenizer: every added token is one id, the reference's.
    Tokenizer *back = tokenizer_load(out, err, sizeof err);
    Tokenizer *ref = tokenizer_load(REFERENCE, err, sizeof err);
    CHECK(back && ref, "%s", err);
    EXPECT(tokenizer_vocab_size(back) == tokenizer_vocab_size(ref), "exported %d pieces, reference %d",
           tokenizer_vocab_size(back), tokenizer_vocab_size(ref));
    for (int i = 0; i < N_ADDED; i++) {
        int32_t ids[4], want[4];
        const int n = tokenizer_encode(back, ADDED[i], ids, 4), m = tokenizer_encode(ref, ADDED[i], want, 4);
        EXPECT(n == 1 && m == 1 && ids[0] == want[0], "%s: %d ids (%d), reference %d ids (%d)",
               ADDED[i], n, ids[0], m, want[0]);
        char key[16];
        snprintf(key, sizeof key, "%d", want[0]);
        const char *content = json_string_value(json_object_get(json_object_get(entries, key), "content"));
        EXPECT(content && strcmp(content, ADDED[i]) == 0, "added_tokens_decoder[%s] is %s", key,
               content ? content : "absent");
    }
    json_decref(written);
    tokenizer_free(back);
    tokenizer_free(ref);
    tokenizer_free(tok);
    config_free(c);
    free(params);
    free(sp);
    param_table_free(&table);
    param_table_free(&st);
}

int main(void) {
    TestRng rng = test_rng_from_env();
    char root[] = "/tmp/test_add_tokens_XXXXXX";
    if (!mkdtemp(root)) fatal("mkdtemp failed");
    check_source(LOADED, root, &rng);  // the new rows grow the matrices
    check_source(1536, root, &rng);    // the new ids fall inside the source's padding rows
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return test_finish();
}
