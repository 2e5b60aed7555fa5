// Config: the key table's defaults in the typed struct, file merge, --set overrides and
// type conversion, the set-key record, and the table's own invariants.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/test_util.h"
#include "trainer/config.h"

// Every key's default, read through the table's offset, equals what the table says.
static void check_defaults(void) {
    RunConfig *c = config_load(NULL, 0, NULL);
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_TABLE[i];
        const void *field = (const char *)c + k->offset;
        EXPECT(config_key_of(c, field) == k, "%s: config_key_of", k->key);
        EXPECT(config_key_find(k->key) == k, "%s: config_key_find", k->key);
        EXPECT(!config_was_set(c, field), "%s: set without a file or --set", k->key);
        switch (k->type) {
        case CFG_STR: {
            const char *v = *(const char *const *)field;
            EXPECT(k->def_str ? v && strcmp(v, k->def_str) == 0 : v == NULL, "%s: default", k->key);
            break;
        }
        case CFG_INT: EXPECT(*(const long long *)field == (long long)k->def_num, "%s", k->key); break;
        case CFG_NUM: EXPECT(*(const double *)field == k->def_num, "%s", k->key); break;
        case CFG_BOOL: EXPECT(*(const bool *)field == k->def_bool, "%s", k->key); break;
        case CFG_LIST: EXPECT(((const ConfigList *)field)->n == 0, "%s", k->key); break;
        }
        if (k->type == CFG_INT || k->type == CFG_NUM)
            EXPECT(k->min <= k->def_num && k->def_num <= k->max, "%s: default out of its range", k->key);
        for (int j = 0; j < i; j++)
            EXPECT(strcmp(CONFIG_TABLE[j].key, k->key) != 0, "%s listed twice", k->key);
    }
    // Spot checks against values written here, not taken from the table.
    EXPECT(c->data.seq_len == 1024 && strcmp(c->data.layout, "duplicate") == 0, "data defaults");
    EXPECT(c->train.lr == 0.003 && c->eval.every == 50 && c->dist.bucket_mb == 25, "numbers");
    EXPECT(c->model.tie_word_embeddings && c->train.resume == NULL, "bool and null defaults");
    EXPECT(strcmp(config_key_of(c, &c->dist.timeout_s)->key, "dist.timeout_s") == 0, "key of field");
    EXPECT((config_key_find("data.layout")->flags & CFG_FIXED) && (config_key_find("out_dir")->flags & CFG_LOCAL) &&
               !(config_key_find("train.lr")->flags & (CFG_FIXED | CFG_LOCAL)),
           "resume flags");
    EXPECT(config_key_find("train.eval_every") == NULL, "a renamed key is not in the table");
    config_free(c);
}

int main(void) {
    check_defaults();
    char *sets[] = {"data.seq_len=2048", "data.layout=mask_only", "train.lr=1", "train.resume=abc",
                    "model.add_tokens=[\"<a>\", \"<b>\"]", "data.chat_template=qwen3"};
    RunConfig *c = config_load(NULL, 6, sets);
    EXPECT(c->data.seq_len == 2048, "seq_len %lld", c->data.seq_len);
    EXPECT(strcmp(c->data.layout, "mask_only") == 0, "layout");
    EXPECT(c->train.lr == 1.0, "integer accepted for a real key");
    EXPECT(strcmp(c->train.resume, "abc") == 0, "null default takes a string");
    EXPECT(c->model.tie_word_embeddings, "default kept");
    EXPECT(c->model.add_tokens.n == 2 && strcmp(c->model.add_tokens.items[1], "<b>") == 0, "list");
    EXPECT(strcmp(c->data.chat_template, "qwen3") == 0, "string");
    EXPECT(config_was_set(c, &c->data.seq_len) && config_was_set(c, &c->model.add_tokens) &&
               !config_was_set(c, &c->data.tokenizer),
           "set keys");
    char *dump = config_dump(c);
    EXPECT(strstr(dump, "\"seq_len\": 2048") != NULL, "dump shows override: %s", dump);
    EXPECT(strstr(dump, "\"lr\": 1.0") != NULL, "a real key stays real in the dump: %s", dump);
    free(dump);
    config_free(c);

    char path[] = "/tmp/onepass_test_config_XXXXXX";
    FILE *f = fdopen(mkstemp(path), "w");
    fputs("{\"train\": {\"steps\": 7}, \"eval\": {\"every\": 3}, \"dist\": {\"timeout_s\": 5}}", f);
    fclose(f);
    char *over[] = {"train.steps=9"};
    c = config_load(path, 1, over);
    EXPECT(c->train.steps == 9 && c->eval.every == 3 && c->dist.timeout_s == 5.0, "file then --set");
    EXPECT(config_was_set(c, &c->eval.every) && !config_was_set(c, &c->eval.max_conversations), "file keys set");
    config_free(c);
    remove(path);
    return test_finish();
}
