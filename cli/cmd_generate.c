// `train generate --config FILE [--set k=v]... --prompts F --out G`: continues every
// conversation of F (JSONL in any accepted format, each ending in a user message) with
// the model of model.init_from; G gets one JSON object per prompt, in order: `prompt` (its
// 0-based index in F) and `line` (its line in F), the generated `text` and its `tokens`
// (ids; the end of turn that ended it is in neither), the `prompt_tokens` (ids) and `stop`
// ("end_of_turn" or "length").
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/check.h"
#include "common/output_file.h"
#include "data/conversation.h"
#include "trainer/data_options.h"
#include "trainer/generate.h"

static const char USAGE[] =
    "usage: train generate --config FILE [--set key=value]... --prompts F.jsonl --out G.jsonl";

static json_t *id_array(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

// Bytes of a valid UTF-8 sequence at s (1-4), or 0 when it is not one.
static int utf8_length(const unsigned char *s) {
    const int n = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] >> 6) != 2) return 0;
    return n;
}

// A generation cut at the length limit may end inside a character (byte-level BPE):
// each byte of a broken sequence becomes U+FFFD, so the line stays valid JSON text.
static char *valid_utf8(const char *text) {
    const size_t len = strlen(text);
    char *out = xmalloc(3 * len + 1), *o = out;
    for (const unsigned char *p = (const unsigned char *)text; *p;) {
        const int n = utf8_length(p);
        if (n) memcpy(o, p, (size_t)n), o += n, p += n;
        else memcpy(o, "\xEF\xBF\xBD", 3), o += 3, p++;
    }
    *o = '\0';
    return out;
}

int cmd_generate(int argc, char **argv) {
    const char *path = NULL, *prompts_path = NULL, *out_path = NULL;
    char **overrides = NULL;
    int n_overrides = 0;
    const int rest = config_take_args(argc, argv, &path, &overrides, &n_overrides);
    for (int i = 0; i < rest; i++) {
        const char **slot = strcmp(argv[i], "--prompts") == 0 ? &prompts_path
                            : strcmp(argv[i], "--out") == 0   ? &out_path
                                                              : NULL;
        if (!slot || i + 1 >= rest) fatal("train generate: unexpected argument '%s' (%s)", argv[i], USAGE);
        *slot = argv[++i];
    }
    if (!prompts_path || !out_path) fatal("train generate: --prompts and --out are required (%s)", USAGE);
    RunConfig *c = config_load(path, n_overrides, overrides);
    free(overrides);

    InferenceModel model;
    inference_model_load(c, "generate", &model);
    const DataOptions data_opt = data_options_from_config(c);
    Dataset data;
    LoadOptions load = data_load_options(&data_opt);  // the run's reading options
    load.prompts = true;
    dataset_load(prompts_path, &load, &data);
    TokenSpan *prompts = generate_prompts(model.tok, data_opt.chat_template, &data,
                                          data_opt.special_in_text, prompts_path);
    char err[1024];
    OutputFile out;  // opened before the work, so a bad --out fails at once
    if (output_open(&out, out_path, err, sizeof err) != 0) fatal("--out %s", err);

    char why[256];
    const DecodeOps *ops = decode_ops(model.backend, why, sizeof why);
    printf("%s\n", why);
    const GenerateOptions opt = generate_options_from(c, model.tok);
    const GenerateTemplate tmpl = generate_template(model.tok, data_opt.chat_template);
    Generation *gens = xcalloc((size_t)data.n_samples + 1, sizeof *gens);
    GenerateStats stats;
    generate(ops, &model.mc, model.params, &opt, tmpl.end_of_turn, prompts, data.n_samples, gens,
             &stats);
    for (int i = 0; i < data.n_samples; i++) {
        char *decoded = generation_text(model.tok, &gens[i]), *text = valid_utf8(decoded);
        free(decoded);
        // The tokens of the text: the end-of-turn id that ended it is "stop", not a token.
        const int n_text = gens[i].ended && gens[i].n > 0 ? gens[i].n - 1 : gens[i].n;
        json_t *line = json_pack("{s:i, s:i, s:s, s:o, s:o, s:s}", "prompt", i, "line",
                                 data.samples[i].line, "text", text, "tokens",
                                 id_array(gens[i].tokens, n_text), "prompt_tokens",
                                 id_array(prompts[i].ids, prompts[i].n), "stop",
                                 gens[i].ended ? "end_of_turn" : "length");
        CHECK(line, "generate: the output line of prompt %d does not format", i);
        char *dump = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fprintf(out.f, "%s\n", dump);
        free(dump), free(text);
        json_decref(line);
        generation_free(&gens[i]);
        free(prompts[i].ids);
    }
    if (output_commit(&out, err, sizeof err) != 0) fatal("--out %s", err);
    printf("generated %lld tokens for %d prompts (%lld prompt tokens) in %.2f s: %.0f tokens/s "
           "(%d decoder calls); wrote %s\n", stats.generated_tokens, data.n_samples,
           stats.prompt_tokens, stats.seconds,
           stats.seconds > 0 ? (double)stats.generated_tokens / stats.seconds : 0.0,
           stats.forward_calls, out_path);
    free(gens), free(prompts);
    dataset_free(&data);
    inference_model_free(&model);
    config_free(c);
    return 0;
}
