// The run configuration: a JSON file merged over the defaults of trainer/config_keys.h,
// then `--set key=value` overrides, type- and range-checked into one typed RunConfig.
// An unknown key is an error naming the file and the key, with the closest key as a
// suggestion; a renamed key names its new spelling. The rest of the program reads the
// struct's fields, never a key string.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "trainer/config_keys.h"

enum { CFG_FIXED = 1, CFG_LOCAL = 2, CFG_MIN_OPEN = 4, CFG_MAX_OPEN = 8, CFG_NULLABLE = 16 };

typedef enum { CFG_STR, CFG_INT, CFG_NUM, CFG_BOOL, CFG_LIST } ConfigType;

// A LIST key's value: n distinct non-empty strings (borrowed from the RunConfig).
typedef struct {
    int n;
    const char *const *items;
} ConfigList;

#define CFG_CTYPE_STR const char *
#define CFG_CTYPE_INT long long
#define CFG_CTYPE_NUM double
#define CFG_CTYPE_BOOL bool
#define CFG_CTYPE_LIST ConfigList
#define CFG_FIELD(section, name, type, def, min, max, flags, doc) CFG_CTYPE_##type name;

typedef struct { CONFIG_KEYS_DATA(CFG_FIELD) } DataKeys;
typedef struct { CONFIG_KEYS_MODEL(CFG_FIELD) } ModelKeys;
typedef struct { CONFIG_KEYS_TRAIN(CFG_FIELD) } TrainKeys;
typedef struct { CONFIG_KEYS_LORA(CFG_FIELD) } LoraKeys;
typedef struct { CONFIG_KEYS_EVAL(CFG_FIELD) } EvalKeys;
typedef struct { CONFIG_KEYS_DIST(CFG_FIELD) } DistKeys;
typedef struct { CONFIG_KEYS_GENERATE(CFG_FIELD) } GenerateKeys;
typedef struct { CONFIG_KEYS_PARITY(CFG_FIELD) } ParityKeys;

typedef struct ConfigSource ConfigSource;

// Every key's resolved value; strings are NULL where the key holds null.
typedef struct RunConfig {
    CONFIG_KEYS_TOP(CFG_FIELD)
    DataKeys data;
    ModelKeys model;
    TrainKeys train;
    LoraKeys lora;
    EvalKeys eval;
    DistKeys dist;
    GenerateKeys generate;
    ParityKeys parity;
    ConfigSource *source;  // the JSON the strings live in and the keys that were set
} RunConfig;

// One row of the key table.
typedef struct {
    const char *section;  // "" for the top level
    const char *name;
    const char *key;      // "section.name", or name at the top level
    ConfigType type;
    const char *def_str;  // STR default (NULL: null)
    double def_num;       // INT / NUM default
    bool def_bool;
    double min, max;
    int flags;
    const char *doc;
    size_t offset;        // of the field in RunConfig
} ConfigKey;

// The table, in listing order, and its length.
extern const ConfigKey CONFIG_TABLE[];
extern const int CONFIG_N_KEYS;

// The table row of a dotted key, or NULL.
const ConfigKey *config_key_find(const char *dotted);
// The table row of a field of c (&c->train.lr); a pointer to no field is a programming error.
const ConfigKey *config_key_of(const RunConfig *c, const void *field);

// Loads `path` (NULL: defaults only) and applies overrides "dotted.key=value"; a value
// is parsed as JSON when it is valid JSON, else taken as a string. Exits with a message
// on any error.
RunConfig *config_load(const char *path, int n_overrides, char *const *overrides);
// config_load over a saved resolved config (a checkpoint's run record) instead of a file:
// its keys but the `this run` ones (CFG_LOCAL: out_dir, train.resume, ... take their
// defaults), then the overrides. set_keys_json: the JSON list of the keys its run set
// (config_set_keys_json), or NULL: those whose value is not the default. `where` names
// the record in errors.
RunConfig *config_load_saved(const char *config_json, const char *set_keys_json, const char *where,
                             int n_overrides, char *const *overrides);
// The keys the file or a --set gave, as a JSON list (malloc'd text).
char *config_set_keys_json(const RunConfig *c);
void config_free(RunConfig *c);

// Whether the config file or a --set gave the key of this field (&c->model.vocab_size);
// false: it holds the default.
bool config_was_set(const RunConfig *c, const void *field);

// Sets a string key's value (&c->data.tokenizer) in the resolved configuration, as a
// value derived from the others (not one the user set: config_was_set stays as it was).
void config_set_string(RunConfig *c, const char **field, const char *value);

// The resolved configuration as indented JSON (malloc'd), for printing and saving.
char *config_dump(const RunConfig *c);

// The key table for people: one line per key (type, default, range, resume rule,
// description), or with markdown the text of docs/CONFIG.md.
void config_describe(FILE *f, bool markdown);

// Command-line helper: removes "--config FILE" and every "--set key=value" from
// argv (compacting it) and returns the new argc. *path stays NULL if absent;
// *overrides points into argv's strings (array malloc'd, caller frees).
int config_take_args(int argc, char **argv, const char **path, char ***overrides,
                     int *n_overrides);
// config_take_args, then config_load of what it took: *argc becomes the count of the
// other arguments, left compacted in argv.
RunConfig *config_load_args(int *argc, char **argv);
