#include "trainer/config.h"

#include <jansson.h>
#include <string.h>

#include "common/check.h"
#include "common/json_names.h"

// The defaults define the schema: every accepted key and its type. A null
// default accepts a string or null.
static const char *const DEFAULTS_JSON =
    "{"
    "  \"backend\": \"auto\","
    "  \"out_dir\": \"runs/strip_thinking\","
    "  \"seed\": 1234,"
    "  \"data\": {"
    "    \"train_path\": \"datasets/synthetic/train.jsonl\","
    "    \"eval_path\": \"datasets/synthetic/eval.jsonl\","
    "    \"tokenizer\": \"datasets/synthetic/tokenizer.model\","
    "    \"layout\": \"duplicate\","
    "    \"seq_len\": 1024,"
    "    \"unpacked\": false,"
    "    \"skip_bad\": false,"
    "    \"skip_too_long\": false,"
    "    \"stats_block\": 64,"
    "    \"special_in_text\": \"plain\""
    "  },"
    "  \"model\": {"
    "    \"vocab_size\": 512,"
    "    \"hidden_size\": 128,"
    "    \"intermediate_size\": 384,"
    "    \"num_hidden_layers\": 4,"
    "    \"num_attention_heads\": 2,"
    "    \"num_key_value_heads\": 1,"
    "    \"rms_norm_eps\": 1e-5,"
    "    \"rope_theta\": 10000.0,"
    "    \"tie_word_embeddings\": true,"
    "    \"init_from\": null"
    "  },"
    "  \"train\": {"
    "    \"steps\": 300,"
    "    \"tokens_per_step\": 2048,"
    "    \"lr\": 0.003,"
    "    \"min_lr_ratio\": 0.1,"
    "    \"warmup_steps\": 20,"
    "    \"weight_decay\": 0.1,"
    "    \"beta1\": 0.9,"
    "    \"beta2\": 0.95,"
    "    \"eps\": 1e-8,"
    "    \"grad_clip\": 1.0,"
    "    \"decay_norms\": false,"
    "    \"decay_embeddings\": false,"
    "    \"eval_every\": 50,"
    "    \"eval_max_conversations\": 32,"
    "    \"checkpoint_every\": 100,"
    "    \"save_dtype\": null,"
    "    \"resume\": null,"
    "    \"deterministic\": true,"
    "    \"micro_rows\": 4,"
    "    \"shuffle\": true,"
    "    \"peak_tflops\": 0.0"
    "  },"
    "  \"parity\": {"
    "    \"conversations\": 16,"
    "    \"weights\": null"
    "  }"
    "}";

struct Config {
    json_t *root;
    json_t *set_keys;  // {dotted key: true} for every key the file or a --set gave
};

// Whether `value` may replace `def` (the default fixes the type).
static bool type_compatible(const json_t *def, const json_t *value) {
    if (json_is_null(def)) return json_is_null(value) || json_is_string(value);
    if (json_is_real(def)) return json_is_number(value);
    if (json_is_boolean(def)) return json_is_boolean(value);
    return json_typeof(def) == json_typeof(value);
}

// Merges `src` into `dst` (both objects) recursively; errors name `where` and the dotted key.
// Each leaf set is recorded in set_keys.
static void merge_checked(json_t *dst, json_t *src, const char *where, const char *prefix,
                          json_t *set_keys) {
    const char *key;
    json_t *value;
    json_object_foreach(src, key, value) {
        char dotted[256];
        snprintf(dotted, sizeof dotted, "%s%s%s", prefix, *prefix ? "." : "", key);
        json_t *def = json_object_get(dst, key);
        if (!def) fatal("%s: unknown config key '%s'", where, dotted);
        if (json_is_object(def)) {
            if (!json_is_object(value))
                fatal("%s: config key '%s' must be an object, got %s", where, dotted, json_type_name(value));
            merge_checked(def, value, where, dotted, set_keys);
            continue;
        }
        if (!type_compatible(def, value))
            fatal("%s: config key '%s' must be %s, got %s", where, dotted, json_type_name(def),
                  json_type_name(value));
        // Keep reals real so later getters see one type per key.
        json_t *stored = json_is_real(def) && json_is_integer(value)
                             ? json_real((double)json_integer_value(value))
                             : json_incref(value);
        json_object_set_new(dst, key, stored);
        json_object_set_new(set_keys, dotted, json_true());
    }
}

static json_t *lookup(const json_t *root, const char *dotted, json_t **parent, const char **leaf) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", dotted);
    json_t *node = (json_t *)root;
    char *save = NULL;
    char *part = strtok_r(buf, ".", &save);
    json_t *up = NULL;
    const char *last = dotted;
    while (part) {
        if (!json_is_object(node)) return NULL;
        up = node;
        last = dotted + (part - buf);
        node = json_object_get(node, part);
        if (!node) return NULL;
        part = strtok_r(NULL, ".", &save);
    }
    if (parent) *parent = up;
    if (leaf) *leaf = last;
    return node;
}

static void apply_override(json_t *root, const char *assignment, json_t *set_keys) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) fatal("--set %s: expected key=value", assignment);
    char key[256];
    size_t key_len = (size_t)(eq - assignment);
    if (key_len >= sizeof key) fatal("--set %s: key too long", assignment);
    memcpy(key, assignment, key_len);
    key[key_len] = '\0';
    json_t *parent = NULL;
    const char *leaf = NULL;
    json_t *def = lookup(root, key, &parent, &leaf);
    if (!def) fatal("--set %s: unknown config key '%s'", assignment, key);
    if (json_is_object(def)) fatal("--set %s: '%s' is a section, set one of its keys", assignment, key);
    json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!value || (json_is_string(value) == false && !type_compatible(def, value) &&
                   (json_is_string(def) || json_is_null(def)))) {
        // Not JSON, or JSON of another type where a string is expected: take it literally.
        json_decref(value);
        value = json_string(eq + 1);
    }
    json_t *wrapper = json_object();
    json_object_set_new(wrapper, leaf, value);
    char where[300];
    snprintf(where, sizeof where, "--set %s", assignment);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(leaf - key > 0 ? leaf - key - 1 : 0), key);
    merge_checked(parent, wrapper, where, prefix, set_keys);
    json_decref(wrapper);
}

Config *config_load(const char *path, int n_overrides, char *const *overrides) {
    json_error_t error;
    json_t *root = json_loads(DEFAULTS_JSON, 0, &error);
    if (!root) fatal("built-in config defaults: %s (line %d)", error.text, error.line);
    json_t *set_keys = json_object();
    if (path) {
        json_t *user = json_load_file(path, 0, &error);
        if (!user) fatal("%s:%d:%d: invalid JSON: %s", path, error.line, error.column, error.text);
        if (!json_is_object(user)) fatal("%s: the config must be a JSON object", path);
        merge_checked(root, user, path, "", set_keys);
        json_decref(user);
    }
    for (int i = 0; i < n_overrides; i++) apply_override(root, overrides[i], set_keys);
    Config *c = xmalloc(sizeof *c);
    c->root = root;
    c->set_keys = set_keys;
    return c;
}

void config_free(Config *c) {
    if (!c) return;
    json_decref(c->root);
    json_decref(c->set_keys);
    free(c);
}

static json_t *get(const Config *c, const char *key) {
    json_t *v = lookup(c->root, key, NULL, NULL);
    CHECK(v, "config key '%s' is not in the defaults", key);
    return v;
}

const char *config_str(const Config *c, const char *key) {
    json_t *v = get(c, key);
    if (json_is_null(v)) return NULL;
    if (!json_is_string(v)) fatal("config key '%s' is not a string", key);
    return json_string_value(v);
}

long long config_int(const Config *c, const char *key) {
    json_t *v = get(c, key);
    if (!json_is_integer(v)) fatal("config key '%s' is not an integer", key);
    return json_integer_value(v);
}

double config_num(const Config *c, const char *key) {
    json_t *v = get(c, key);
    if (!json_is_number(v)) fatal("config key '%s' is not a number", key);
    return json_number_value(v);
}

bool config_bool(const Config *c, const char *key) {
    json_t *v = get(c, key);
    if (!json_is_boolean(v)) fatal("config key '%s' is not a boolean", key);
    return json_is_true(v);
}

bool config_was_set(const Config *c, const char *key) {
    get(c, key);  // a key outside the defaults is a programming error
    return json_object_get(c->set_keys, key) != NULL;
}

char *config_dump(const Config *c) {
    return json_dumps(c->root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
}

int config_take_args(int argc, char **argv, const char **path, char ***overrides,
                     int *n_overrides) {
    *path = NULL;
    *overrides = xcalloc((size_t)argc, sizeof(char *));
    *n_overrides = 0;
    int out = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 || strcmp(argv[i], "--set") == 0) {
            if (i + 1 >= argc) fatal("%s needs a value", argv[i]);
            if (argv[i][2] == 'c') *path = argv[++i];
            else (*overrides)[(*n_overrides)++] = argv[++i];
        } else {
            argv[out++] = argv[i];
        }
    }
    return out;
}
