// Run configuration: JSON (jansson) merged over the built-in defaults, then
// `--set key=value` overrides. Every key must exist in the defaults: an unknown
// key or a value of the wrong type is an error naming the file and the key.
#pragma once
#include <stdbool.h>
#include <stdio.h>

typedef struct Config Config;

// Loads `path` (NULL: defaults only) and applies overrides "dotted.key=value";
// a value is parsed as JSON when it is valid JSON, else taken as a string.
// Exits with a message on any error.
Config *config_load(const char *path, int n_overrides, char *const *overrides);
void config_free(Config *c);

// Typed getters by dotted key ("data.seq_len"). A missing key is a programming error (fatal).
const char *config_str(const Config *c, const char *key);
long long config_int(const Config *c, const char *key);
double config_num(const Config *c, const char *key);  // accepts integers too
bool config_bool(const Config *c, const char *key);
// A list of non-empty, distinct strings (fatal otherwise, naming the key and the index):
// returns its length, the strings (borrowed from c) in *out, malloc'd.
int config_str_list(const Config *c, const char *key, const char ***out);

// Whether the config file or a --set gave this key (false: it holds the default).
bool config_was_set(const Config *c, const char *key);

// The resolved configuration as indented JSON (malloc'd), for printing and saving.
char *config_dump(const Config *c);

// Command-line helper: removes "--config FILE" and every "--set key=value" from
// argv (compacting it) and returns the new argc. *path stays NULL if absent;
// *overrides points into argv's strings (array malloc'd, caller frees).
int config_take_args(int argc, char **argv, const char **path, char ***overrides,
                     int *n_overrides);
