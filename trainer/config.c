#include "trainer/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/check.h"
#include "common/json_names.h"
#include "common/output_file.h"

#define CFG_DEF_STR(d) .def_str = d
#define CFG_DEF_INT(d) .def_num = d
#define CFG_DEF_NUM(d) .def_num = d
#define CFG_DEF_BOOL(d) .def_bool = d
#define CFG_DEF_LIST(d) .def_str = NULL
// name: key_text after "section." (the whole key at the top level).
#define CFG_ROW_AT(sec, key_text, member, ty, def, lo, hi, fl, text)                             \
    {.section = sec, .name = key_text + sizeof sec - 1 + (sizeof sec > 1), .key = key_text, .type = CFG_##ty, CFG_DEF_##ty(def),       \
     .min = lo, .max = hi, .flags = fl, .doc = text, .offset = offsetof(RunConfig, member)},
#define CFG_ROW(section, name, ty, def, lo, hi, fl, text)                                       \
    CFG_ROW_AT(#section, #section "." #name, section.name, ty, def, lo, hi, fl, text)
#define CFG_TOP_ROW(section, name, ty, def, lo, hi, fl, text)                                   \
    CFG_ROW_AT("", #name, name, ty, def, lo, hi, fl, text)

const ConfigKey CONFIG_TABLE[] = {
    CONFIG_KEYS_TOP(CFG_TOP_ROW)
    CONFIG_KEYS_DATA(CFG_ROW)
    CONFIG_KEYS_MODEL(CFG_ROW)
    CONFIG_KEYS_TRAIN(CFG_ROW)
    CONFIG_KEYS_LORA(CFG_ROW)
    CONFIG_KEYS_EVAL(CFG_ROW)
    CONFIG_KEYS_DIST(CFG_ROW)
    CONFIG_KEYS_GENERATE(CFG_ROW)
    CONFIG_KEYS_PARITY(CFG_ROW)
};
const int CONFIG_N_KEYS = (int)(sizeof CONFIG_TABLE / sizeof CONFIG_TABLE[0]);

// Keys that moved: renamed (how NULL) or replaced by a key of other values (how says
// which old value is which new one).
#define CFG_RENAMED_ROW(old, now) {old, now, NULL},
#define CFG_REPLACED_ROW(old, now, how) {old, now, how},
static const struct {
    const char *old, *now, *how;
} MOVED[] = {CONFIG_RENAMED(CFG_RENAMED_ROW) CONFIG_REPLACED(CFG_REPLACED_ROW)};
enum { N_MOVED = sizeof MOVED / sizeof MOVED[0] };

struct ConfigSource {
    json_t *root;      // the resolved tree: every key, sections as objects
    json_t *set_keys;  // {dotted key: true} for every key the file or a --set gave
};

const ConfigKey *config_key_find(const char *dotted) {
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (strcmp(CONFIG_TABLE[i].key, dotted) == 0) return &CONFIG_TABLE[i];
    return NULL;
}

const ConfigKey *config_key_of(const RunConfig *c, const void *field) {
    const size_t offset = (size_t)((const char *)field - (const char *)c);
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (CONFIG_TABLE[i].offset == offset) return &CONFIG_TABLE[i];
    CHECK(false, "config_key_of: offset %zu is no key's field", offset);
    return NULL;
}

static bool is_section(const char *name) {
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (strcmp(CONFIG_TABLE[i].section, name) == 0) return true;
    return false;
}

// Edit distance (insertions, deletions, substitutions), for suggestions.
static int edit_distance(const char *a, const char *b) {
    const size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64) return 1 << 20;
    int row[65];
    for (size_t j = 0; j <= m; j++) row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            const int up = row[j];
            const int sub = diag + (a[i - 1] != b[j - 1]);
            row[j] = sub < up + 1 ? sub : up + 1;
            if (row[j - 1] + 1 < row[j]) row[j] = row[j - 1] + 1;
            diag = up;
        }
    }
    return row[m];
}

// Fatal for a key that is not in the table: its new spelling when it was renamed, else
// the closest key (by edit distance over the dotted key, or the same name in another
// section) when one is close.
static _Noreturn void fail_unknown_key(const char *where, const char *dotted) {
    for (int i = 0; i < N_MOVED; i++) {
        if (strcmp(MOVED[i].old, dotted) != 0) continue;
        if (!MOVED[i].how) fatal("%s: config key '%s' is now '%s'", where, dotted, MOVED[i].now);
        fatal("%s: config key '%s' is replaced by '%s' (%s)", where, dotted, MOVED[i].now,
              MOVED[i].how);
    }
    const char *leaf = strrchr(dotted, '.');
    leaf = leaf ? leaf + 1 : dotted;
    const ConfigKey *best = NULL;
    int best_d = 1 << 20;
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_TABLE[i];
        int d = edit_distance(dotted, k->key);
        if (strcmp(k->name, leaf) == 0 && d > 1) d = 1;  // right name, wrong section
        if (d < best_d) best_d = d, best = k;
    }
    const int limit = strlen(dotted) < 9 ? 2 : 3;
    if (best && best_d <= limit)
        fatal("%s: unknown config key '%s' (did you mean '%s'?); `train config` lists them", where,
              dotted, best->key);
    fatal("%s: unknown config key '%s'; `train config` lists them", where, dotted);
}

static const char *type_name(const ConfigKey *k) {
    switch (k->type) {
    case CFG_STR: return k->def_str && !(k->flags & CFG_NULLABLE) ? "a string" : "a string or null";
    case CFG_INT: return "an integer";
    case CFG_NUM: return "a number";
    case CFG_BOOL: return "a boolean";
    case CFG_LIST: return "a list of strings";
    }
    return "?";
}

static bool type_accepts(const ConfigKey *k, const json_t *v) {
    switch (k->type) {
    case CFG_STR:
        return json_is_string(v) || ((!k->def_str || (k->flags & CFG_NULLABLE)) && json_is_null(v));
    case CFG_INT: return json_is_integer(v);
    case CFG_NUM: return json_is_number(v);
    case CFG_BOOL: return json_is_boolean(v);
    case CFG_LIST: return json_is_array(v);
    }
    return false;
}

static json_t *default_value(const ConfigKey *k) {
    switch (k->type) {
    case CFG_STR: return k->def_str ? json_string(k->def_str) : json_null();
    case CFG_INT: return json_integer((json_int_t)k->def_num);
    case CFG_NUM: return json_real(k->def_num);
    case CFG_BOOL: return json_boolean(k->def_bool);
    case CFG_LIST: return json_array();
    }
    return NULL;
}

// The tree of defaults: top-level keys, then one object per section, in table order.
static json_t *defaults_tree(void) {
    json_t *root = json_object();
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_TABLE[i];
        json_t *parent = root;
        if (*k->section) {
            parent = json_object_get(root, k->section);
            if (!parent) {
                parent = json_object();
                json_object_set_new(root, k->section, parent);
            }
        }
        json_object_set_new(parent, k->name, default_value(k));
    }
    return root;
}

// Sets `value` (stolen) as the key's value in root, type-checked; errors name `where`.
static void set_checked(json_t *root, const ConfigKey *k, json_t *value, const char *where,
                        json_t *set_keys) {
    if (!type_accepts(k, value)) {
        const char *got = json_type_name(value);
        json_decref(value);
        fatal("%s: config key '%s' must be %s, got %s", where, k->key, type_name(k), got);
    }
    // Keep reals real so the tree holds one JSON type per key.
    if (k->type == CFG_NUM && json_is_integer(value)) {
        json_t *real = json_real((double)json_integer_value(value));
        json_decref(value);
        value = real;
    }
    json_t *parent = *k->section ? json_object_get(root, k->section) : root;
    json_object_set_new(parent, k->name, value);
    json_object_set_new(set_keys, k->key, json_true());
}

// Merges the user's object `src` (prefix "" at the top, else a section name) into root.
static void merge_checked(json_t *root, json_t *src, const char *where, const char *prefix,
                          json_t *set_keys) {
    const char *key;
    json_t *value;
    json_object_foreach(src, key, value) {
        char dotted[256];
        snprintf(dotted, sizeof dotted, "%s%s%s", prefix, *prefix ? "." : "", key);
        if (!*prefix && is_section(key)) {
            if (!json_is_object(value))
                fatal("%s: config key '%s' must be an object, got %s", where, dotted,
                      json_type_name(value));
            merge_checked(root, value, where, key, set_keys);
            continue;
        }
        const ConfigKey *k = config_key_find(dotted);
        if (!k) fail_unknown_key(where, dotted);
        set_checked(root, k, json_incref(value), where, set_keys);
    }
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
    const size_t key_len = (size_t)(eq - assignment);
    if (key_len >= sizeof key) fatal("--set %s: key too long", assignment);
    memcpy(key, assignment, key_len);
    key[key_len] = '\0';
    if (!well_formed_key(key)) fatal("--set %s: malformed key '%s' (an empty part)", assignment, key);
    char where[300];
    snprintf(where, sizeof where, "--set %s", assignment);
    if (is_section(key)) fatal("--set %s: '%s' is a section, set one of its keys", assignment, key);
    const ConfigKey *k = config_key_find(key);
    if (!k) fail_unknown_key(where, key);
    json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    const bool numeric = k->type == CFG_INT || k->type == CFG_NUM;
    if (!value && numeric && is_out_of_range_number(eq + 1))
        fatal("--set %s: config key '%s' must be a finite number, got '%s'", assignment, key, eq + 1);
    // Not JSON, or JSON of another type where a string is expected: take it literally.
    if (!value || (k->type == CFG_STR && !type_accepts(k, value))) {
        json_decref(value);
        value = json_string(eq + 1);  // NULL: not UTF-8, which no JSON string can hold
        if (!value) fatal("--set %s: config key '%s': the value is not valid UTF-8", assignment, key);
    }
    set_checked(root, k, value, where, set_keys);
}

static const json_t *value_of(const json_t *root, const ConfigKey *k) {
    const json_t *parent = *k->section ? json_object_get(root, k->section) : root;
    return json_object_get(parent, k->name);
}

// Fatal, naming the key and where its value came from, for a value out of its range.
static void check_range(const ConfigKey *k, const json_t *v, const char *where) {
    const double x = json_number_value(v);
    const bool min_open = k->flags & CFG_MIN_OPEN, max_open = k->flags & CFG_MAX_OPEN;
    const bool below = min_open ? !(x > k->min) : !(x >= k->min);
    const bool above = max_open ? !(x < k->max) : !(x <= k->max);
    if (!below && !above) return;
    char got[64];
    if (json_is_integer(v)) snprintf(got, sizeof got, "%lld", (long long)json_integer_value(v));
    else snprintf(got, sizeof got, "%g", x);
    fatal("%sconfig key '%s': must be in %c%.17g, %.17g%c, got %s", where, k->key,
          min_open ? '(' : '[', k->min, k->max, max_open ? ')' : ']', got);
}

// A LIST value: distinct non-empty strings, into a malloc'd array borrowed from v.
static ConfigList list_from(const ConfigKey *k, const json_t *v) {
    const int n = (int)json_array_size(v);
    const char **items = xcalloc((size_t)n + 1, sizeof(char *));
    for (int i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(v, (size_t)i));
        if (!s || !*s) fatal("config key '%s': [%d] must be a non-empty string", k->key, i);
        for (int j = 0; j < i; j++)
            if (strcmp(items[j], s) == 0) fatal("config key '%s': [%d] '%s' repeats [%d]", k->key, i, s, j);
        items[i] = s;
    }
    return (ConfigList){.n = n, .items = items};
}

// Every key's value from the resolved tree into its field, range-checked.
static void fill_fields(RunConfig *c, const json_t *root, const char *where) {
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_TABLE[i];
        const json_t *v = value_of(root, k);
        void *field = (char *)c + k->offset;
        switch (k->type) {
        case CFG_STR: *(const char **)field = json_string_value(v); break;
        case CFG_INT:
            check_range(k, v, where);
            *(long long *)field = json_integer_value(v);
            break;
        case CFG_NUM:
            check_range(k, v, where);
            *(double *)field = json_number_value(v);
            break;
        case CFG_BOOL: *(bool *)field = json_is_true(v); break;
        case CFG_LIST: *(ConfigList *)field = list_from(k, v); break;
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

// The tokenizer file a data.tokenizer path names (data/tokenizer.h's rule: itself, or a
// folder's tokenizer.json, else its tokenizer.model) into out; false when there is none.
static bool tokenizer_file_of(const char *path, char *out, size_t len) {
    struct stat st;
    if (stat(path, &st) != 0) return false;
    if (!S_ISDIR(st.st_mode)) {
        snprintf(out, len, "%s", path);
        return S_ISREG(st.st_mode);
    }
    static const char *const NAMES[] = {"tokenizer.json", "tokenizer.model"};
    for (int i = 0; i < 2; i++) {
        snprintf(out, len, "%s/%s", path, NAMES[i]);
        if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) return true;
    }
    return false;
}

// Whether two files hold the same bytes (false when either cannot be read).
static bool same_bytes(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    char x[65536], y[65536];
    while (same) {
        const size_t n = fread(x, 1, sizeof x, fa), m = fread(y, 1, sizeof y, fb);
        same = n == m && memcmp(x, y, n) == 0;
        if (n < sizeof x) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

// With model.init_from, the tokenizer is the folder's own: data.tokenizer left at its
// default becomes the folder; one naming a tokenizer of the same bytes becomes the folder
// too (its tokenizer_config.json and template come along); another one is refused, naming
// both, unless data.tokenizer_override says so. A folder without a tokenizer needs
// data.tokenizer named.
static void resolve_tokenizer(RunConfig *c) {
    const char *dir = c->model.init_from;
    struct stat st;
    if (!dir || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return;  // refused where it is read
    char own[4200], named[4200];
    const bool has_own = tokenizer_file_of(dir, own, sizeof own);
    const bool was_set = config_was_set(c, &c->data.tokenizer);
    if (!has_own) {
        if (!was_set)
            fatal("config key 'model.init_from': %s has no tokenizer.json or tokenizer.model; "
                  "set data.tokenizer to the tokenizer its token ids are from", dir);
        return;
    }
    if (!was_set || !c->data.tokenizer ||
        (tokenizer_file_of(c->data.tokenizer, named, sizeof named) && same_bytes(own, named))) {
        config_set_string(c, &c->data.tokenizer, dir);
        return;
    }
    if (!c->data.tokenizer_override)
        fatal("config key 'data.tokenizer': %s is not the tokenizer of model.init_from (%s); "
              "leave data.tokenizer out to train with the model's own, or set "
              "data.tokenizer_override=true to train its weights on another tokenizer's ids",
              c->data.tokenizer, own);
}

// The keys of saved (a resolved config) that its run set: those named in set_list (a
// JSON array) when there is one, else those whose value is not the default.
static json_t *saved_set_keys(const json_t *saved, const json_t *set_list) {
    json_t *set_keys = json_object();
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_TABLE[i];
        bool set = false;
        if (json_is_array(set_list)) {
            size_t j;
            const json_t *v;
            json_array_foreach(set_list, j, v) set |= json_is_string(v) && strcmp(json_string_value(v), k->key) == 0;
        } else {
            json_t *def = default_value(k);
            const json_t *value = value_of(saved, k);
            set = value && !json_equal(value, def);
            json_decref(def);
        }
        if (set) json_object_set_new(set_keys, k->key, json_true());
    }
    return set_keys;
}

// config_load over a base: a user file (path), or a saved resolved config (saved, with
// the keys its run set: set_list, NULL for those that differ from the default).
static RunConfig *config_load_over(const char *path, const json_t *saved, const json_t *set_list,
                                   const char *saved_where, int n_overrides, char *const *overrides) {
    json_t *root = defaults_tree();
    json_t *set_keys = json_object();
    if (path) {
        json_t *user = load_user_file(path);
        merge_checked(root, user, path, "", set_keys);
        json_decref(user);
    } else if (saved) {
        if (!json_is_object(saved)) fatal("%s: the saved config is not a JSON object", saved_where);
        json_t *all = json_object();
        merge_checked(root, (json_t *)saved, saved_where, "", all);
        json_decref(all);
        json_decref(set_keys);
        set_keys = saved_set_keys(saved, set_list);
        path = saved_where;
    }
    for (int i = 0; i < n_overrides; i++) apply_override(root, overrides[i], set_keys);
    // A value out of range names the file when nothing was set over it.
    char where[4200] = "";
    if (path && n_overrides == 0) snprintf(where, sizeof where, "%s: ", path);
    RunConfig *c = xcalloc(1, sizeof *c);
    c->source = xmalloc(sizeof *c->source);
    c->source->root = root;
    c->source->set_keys = set_keys;
    fill_fields(c, root, where);
    resolve_tokenizer(c);
    return c;
}

RunConfig *config_load(const char *path, int n_overrides, char *const *overrides) {
    return config_load_over(path, NULL, NULL, NULL, n_overrides, overrides);
}

RunConfig *config_load_saved(const char *config_json, const char *set_keys_json, const char *where,
                             int n_overrides, char *const *overrides) {
    json_error_t error;
    json_t *saved = json_loads(config_json, 0, &error);
    if (!saved) fatal("%s: the saved config does not parse: %s", where, error.text);
    json_t *set_list = set_keys_json ? json_loads(set_keys_json, 0, NULL) : NULL;
    // Where this run goes is the new run's: out_dir, train.resume, ... take their defaults.
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_TABLE[i];
        if (!(k->flags & CFG_LOCAL)) continue;
        json_t *parent = *k->section ? json_object_get(saved, k->section) : saved;
        if (json_is_object(parent)) json_object_del(parent, k->name);
    }
    RunConfig *c = config_load_over(NULL, saved, set_list, where, n_overrides, overrides);
    json_decref(saved);
    json_decref(set_list);
    return c;
}

char *config_set_keys_json(const RunConfig *c) {
    json_t *list = json_array();
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (json_object_get(c->source->set_keys, CONFIG_TABLE[i].key))
            json_array_append_new(list, json_string(CONFIG_TABLE[i].key));
    char *text = json_dumps(list, JSON_COMPACT);
    json_decref(list);
    return text;
}

void config_free(RunConfig *c) {
    if (!c) return;
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (CONFIG_TABLE[i].type == CFG_LIST)
            free((void *)((ConfigList *)((char *)c + CONFIG_TABLE[i].offset))->items);
    json_decref(c->source->root);
    json_decref(c->source->set_keys);
    free(c->source);
    free(c);
}

bool config_was_set(const RunConfig *c, const void *field) {
    return json_object_get(c->source->set_keys, config_key_of(c, field)->key) != NULL;
}

void config_set_string(RunConfig *c, const char **field, const char *value) {
    const ConfigKey *k = config_key_of(c, field);
    CHECK(k->type == CFG_STR, "config_set_string: %s is not a string key", k->key);
    json_t *parent = *k->section ? json_object_get(c->source->root, k->section) : c->source->root;
    json_object_set_new(parent, k->name, value ? json_string(value) : json_null());
    *field = json_string_value(json_object_get(parent, k->name));
}

char *config_dump(const RunConfig *c) {
    return json_dumps(c->source->root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
}

// The default as JSON text ("null", "\"auto\"", "[]", "0.003").
static char *default_text(const ConfigKey *k) {
    json_t *v = default_value(k);
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(10));
    json_decref(v);
    return text;
}

// A bound as people write it: 9007199254740992 rather than 9.007199255e+15.
static void number_text(double x, char *buf, size_t len) {
    if (isinf(x)) snprintf(buf, len, "inf");
    else if (x == floor(x) && fabs(x) < 1e17) snprintf(buf, len, "%.0f", x);
    else snprintf(buf, len, "%g", x);
}

// "[0, 1)" for a numeric key, "" otherwise.
static void range_text(const ConfigKey *k, char *buf, size_t len) {
    if (k->type != CFG_INT && k->type != CFG_NUM) {
        buf[0] = '\0';
        return;
    }
    char lo[32], hi[32];
    number_text(k->min, lo, sizeof lo);
    number_text(k->max, hi, sizeof hi);
    snprintf(buf, len, "%c%s, %s%c", k->flags & CFG_MIN_OPEN ? '(' : '[', lo, hi,
             k->flags & CFG_MAX_OPEN ? ')' : ']');
}

static const char *short_type(ConfigType t) {
    static const char *const names[] = {"string", "int", "number", "bool", "list"};
    return names[t];
}

static const char *resume_text(const ConfigKey *k) {
    if (k->flags & CFG_FIXED) return "fixed";
    if (k->flags & CFG_LOCAL) return "this run";
    return "may change";
}

void config_describe(FILE *f, bool markdown) {
    if (markdown) {
        fputs("# Configuration keys\n\n"
              "Generated by `train config --markdown` from `trainer/config_keys.h`, the one table of\n"
              "keys; `cli_config_doc` fails when this file differs from it.\n\n"
              "A run reads a JSON file (`--config FILE`) of these keys, merged over the defaults,\n"
              "then each `--set key=value` (a value that is not JSON is taken as a string). Paths\n"
              "resolve from the working directory. An unknown key is refused naming the file and\n"
              "the closest key. Resume: `fixed` keys decide the model, the data's tokens or their\n"
              "order, and a resume that changes one is refused; `may change` keys are printed\n"
              "when they differ from the checkpoint's; `this run` keys say where the run goes.\n",
              f);
    }
    const char *section = NULL;
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_TABLE[i];
        char *def = default_text(k);
        char range[96];
        range_text(k, range, sizeof range);
        if (markdown) {
            if (!section || strcmp(section, k->section) != 0) {
                section = k->section;
                fprintf(f, "\n## %s\n\n| key | type | default | range | resume | description |\n"
                           "|---|---|---|---|---|---|\n",
                        *section ? section : "top level");
            }
            fprintf(f, "| `%s` | %s | `%s` | %s | %s | ", k->key, short_type(k->type), def, range,
                    resume_text(k));
            for (const char *p = k->doc; *p; p++) {  // a '|' would end the table cell
                if (*p == '|') fputc('\\', f);
                fputc(*p, f);
            }
            fputs(" |\n", f);
        } else {
            fprintf(f, "%-30s %-6s %-34s %-22s %-10s %s\n", k->key, short_type(k->type), def, range,
                    resume_text(k), k->doc);
        }
        free(def);
    }
    if (markdown) {
        fputs("\n## Renamed keys\n\nThe old spelling is refused naming the new one.\n\n"
              "| old | new |\n|---|---|\n", f);
        for (int i = 0; i < N_MOVED; i++)
            fprintf(f, "| `%s` | `%s`%s%s |\n", MOVED[i].old, MOVED[i].now, MOVED[i].how ? ": " : "",
                    MOVED[i].how ? MOVED[i].how : "");
    }
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

RunConfig *config_load_args(int *argc, char **argv) {
    const char *path;
    char **overrides;
    int n_overrides;
    *argc = config_take_args(*argc, argv, &path, &overrides, &n_overrides);
    RunConfig *c = config_load(path, n_overrides, overrides);
    free(overrides);
    return c;
}
