#include "trainer/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/json_names.h"
#include "common/output_file.h"

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
    "    \"special_in_text\": \"plain\","
    "    \"ignore_unknown_keys\": false,"
    "    \"max_line_bytes\": 0,"
    "    \"train_on\": \"think_answer\","
    "    \"skip_empty_think_turns\": false,"
    "    \"template\": null"
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
    "    \"init_from\": null,"
    "    \"add_tokens\": []"
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
    "    \"keep_mlp_activations\": false,"
    "    \"micro_rows\": 4,"
    "    \"shuffle\": true,"
    "    \"peak_tflops\": 0.0,"
    "    \"overwrite\": false,"
    "    \"rendezvous_file\": null,"
    "    \"bucket_mb\": 25,"
    "    \"dist_timeout_s\": 1800"
    "  },"
    "  \"generate\": {"
    "    \"max_new_tokens\": 384,"
    "    \"temperature\": 0.0,"
    "    \"top_p\": 1.0,"
    "    \"seed\": 0,"
    "    \"batch\": 32"
    "  },"
    "  \"eval\": {"
    "    \"generate_conversations\": 0"
    "  },"
    "  \"parity\": {"
    "    \"conversations\": 16,"
    "    \"weights\": null"
    "  }"
    "}";

// The valid range of every numeric key, checked once the config is resolved (the
// file and every --set merged), so a value outside it is refused before anything runs.
// The upper bounds of the sizes keep memory that the input decides bounded (issue 14).
typedef struct {
    const char *key;
    double min, max;
    bool min_open, max_open;  // the bound itself excluded
} KeyRange;

#define ONE_G (1 << 30)
static const KeyRange RANGES[] = {
    {"seed", 0, 9007199254740992.0, false, false},
    {"data.seq_len", 1, 1 << 20, false, false},
    {"data.stats_block", 1, 4096, false, false},
    {"data.max_line_bytes", 0, 1LL << 40, false, false},
    {"model.vocab_size", 1, 1 << 24, false, false},
    {"model.hidden_size", 1, 1 << 16, false, false},
    {"model.intermediate_size", 1, 1 << 18, false, false},
    {"model.num_hidden_layers", 1, 1024, false, false},
    {"model.num_attention_heads", 1, 1024, false, false},
    {"model.num_key_value_heads", 1, 1024, false, false},
    {"model.rms_norm_eps", 0, 1, true, false},
    {"model.rope_theta", 0, 1e12, true, false},
    {"train.steps", 1, ONE_G, false, false},
    {"train.tokens_per_step", 1, 1 << 24, false, false},
    {"train.lr", 0, INFINITY, false, true},
    {"train.min_lr_ratio", 0, 1, false, false},
    {"train.warmup_steps", 0, ONE_G, false, false},
    {"train.weight_decay", 0, 100, false, false},
    {"train.beta1", 0, 1, false, true},
    {"train.beta2", 0, 1, false, true},
    {"train.eps", 0, 1, true, false},
    {"train.grad_clip", 0, INFINITY, false, true},
    {"train.eval_every", 0, ONE_G, false, false},
    {"train.eval_max_conversations", 0, ONE_G, false, false},
    {"train.checkpoint_every", 0, ONE_G, false, false},
    {"train.micro_rows", 1, 1 << 16, false, false},
    {"train.bucket_mb", 1, 4096, false, false},
    {"train.dist_timeout_s", 0, 1e6, true, false},
    {"train.peak_tflops", 0, 1e7, false, false},
    {"generate.max_new_tokens", 1, 1 << 20, false, false},
    {"generate.temperature", 0, 100, false, false},
    {"generate.top_p", 0, 1, true, false},
    {"generate.seed", 0, 9007199254740992.0, false, false},
    {"generate.batch", 1, 1 << 16, false, false},
    {"eval.generate_conversations", 0, ONE_G, false, false},
    {"parity.conversations", 1, 1 << 20, false, false},
};

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

// A dotted key has no empty part ("data..seq_len", ".seed", "seed.").
static bool well_formed_key(const char *key) {
    if (!*key || key[0] == '.' || key[strlen(key) - 1] == '.') return false;
    return strstr(key, "..") == NULL;
}

// A number that JSON cannot hold as a double (1e999): say so rather than "a string".
static bool is_out_of_range_number(const char *text) {
    char *end = NULL;
    errno = 0;
    const double v = strtod(text, &end);
    return end != text && *end == '\0' && (errno == ERANGE || !isfinite(v));
}

static void apply_override(json_t *root, const char *assignment, json_t *set_keys) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) fatal("--set %s: expected key=value", assignment);
    char key[256];
    size_t key_len = (size_t)(eq - assignment);
    if (key_len >= sizeof key) fatal("--set %s: key too long", assignment);
    memcpy(key, assignment, key_len);
    key[key_len] = '\0';
    if (!well_formed_key(key)) fatal("--set %s: malformed key '%s' (an empty part)", assignment, key);
    json_t *parent = NULL;
    const char *leaf = NULL;
    json_t *def = lookup(root, key, &parent, &leaf);
    if (!def) fatal("--set %s: unknown config key '%s'", assignment, key);
    if (json_is_object(def)) fatal("--set %s: '%s' is a section, set one of its keys", assignment, key);
    json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!value && json_is_number(def) && is_out_of_range_number(eq + 1))
        fatal("--set %s: config key '%s' must be a finite number, got '%s'", assignment, key, eq + 1);
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

// Fatal, naming the key and where its value came from, for a value out of its range.
static void check_ranges(const json_t *root, const char *where) {
    for (size_t i = 0; i < sizeof RANGES / sizeof RANGES[0]; i++) {
        const KeyRange *r = &RANGES[i];
        const json_t *v = lookup(root, r->key, NULL, NULL);
        CHECK(v && json_is_number(v), "range for '%s', which is not a numeric default", r->key);
        const double x = json_number_value(v);
        const bool below = r->min_open ? !(x > r->min) : !(x >= r->min);
        const bool above = r->max_open ? !(x < r->max) : !(x <= r->max);
        if (below || above) {
            char got[64];
            if (json_is_integer(v)) snprintf(got, sizeof got, "%lld", (long long)json_integer_value(v));
            else snprintf(got, sizeof got, "%g", x);
            fatal("%sconfig key '%s': must be in %c%.17g, %.17g%c, got %s", where, r->key,
                  r->min_open ? '(' : '[', r->min, r->max, r->max_open ? ')' : ']', got);
        }
    }
}

// The user's config file: a regular file of one JSON object, without a byte order mark
// or duplicate keys. Fatal with "path: what" (or "path:line:column:" for bad JSON).
static json_t *load_user_file(const char *path) {
    char err[1024];
    if (input_file_check(path, err, sizeof err) != 0) fatal("%s", err);
    FILE *f = fopen(path, "rb");
    if (!f) fatal("%s: cannot open: %s", path, strerror(errno));
    unsigned char head[3] = {0};
    const size_t n = fread(head, 1, 3, f);
    fclose(f);
    if (n == 3 && head[0] == 0xEF && head[1] == 0xBB && head[2] == 0xBF)
        fatal("%s: starts with a UTF-8 byte order mark (BOM); save it without one", path);
    json_error_t error;
    json_t *user = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
    if (!user) fatal("%s:%d:%d: invalid JSON: %s", path, error.line, error.column, error.text);
    if (!json_is_object(user)) fatal("%s: the config must be a JSON object", path);
    return user;
}

Config *config_load(const char *path, int n_overrides, char *const *overrides) {
    json_error_t error;
    json_t *root = json_loads(DEFAULTS_JSON, 0, &error);
    if (!root) fatal("built-in config defaults: %s (line %d)", error.text, error.line);
    json_t *set_keys = json_object();
    if (path) {
        json_t *user = load_user_file(path);
        merge_checked(root, user, path, "", set_keys);
        json_decref(user);
    }
    for (int i = 0; i < n_overrides; i++) apply_override(root, overrides[i], set_keys);
    // A value out of range names the file when nothing was set over it.
    char where[4200] = "";
    if (path && n_overrides == 0) snprintf(where, sizeof where, "%s: ", path);
    check_ranges(root, where);
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

int config_str_list(const Config *c, const char *key, const char ***out) {
    json_t *v = get(c, key);
    if (!json_is_array(v)) fatal("config key '%s' is not a list", key);
    const int n = (int)json_array_size(v);
    *out = xcalloc((size_t)n + 1, sizeof(char *));
    for (int i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(v, (size_t)i));
        if (!s || !*s) fatal("config key '%s': [%d] must be a non-empty string", key, i);
        for (int j = 0; j < i; j++)
            if (strcmp((*out)[j], s) == 0) fatal("config key '%s': [%d] '%s' repeats [%d]", key, i, s, j);
        (*out)[i] = s;
    }
    return n;
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
