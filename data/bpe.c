// Byte-level BPE from a Hugging Face tokenizer.json (data/bpe.h). The steps of an
// encode, in the reference implementation's order:
//   1. added tokens, leftmost-longest on the raw text (skipped in plain mode)
//   2. each stretch between them: NFC (when asked), then the Split regexes in turn
//   3. each pre-token: its bytes through the byte-to-unicode map, then BPE merges by
//      rank (lowest first, leftmost among equals), or the whole word when ignore_merges
//      and the vocabulary has it.
#define _POSIX_C_SOURCE 200809L
#include "data/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/check.h"

// The GPT-2 regex, used by ByteLevel(use_regex: true).
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum { MAX_REGEXES = 8 };

// String -> id, open addressing (capacity a power of two, at least twice the count).
typedef struct {
    const char **keys;  // [cap] borrowed from Bpe.pieces; NULL = empty slot
    int32_t *values;    // [cap]
    size_t cap;
} StrMap;

// (left id, right id) -> merge rank and merged id.
typedef struct {
    uint64_t *keys;    // [cap] (left << 32 | right) + 1; 0 = empty slot
    int32_t *ranks;    // [cap]
    int32_t *merged;   // [cap]
    size_t cap;
} PairMap;

typedef struct {
    char *content;
    size_t len;
    int32_t id;
} AddedToken;

struct Bpe {
    int vocab_size;            // max id + 1 over the vocabulary and the added tokens
    char **pieces;             // [vocab_size] the vocabulary's strings (mapped alphabet)
    bool *is_added;            // [vocab_size] decoded as its content, not through the map
    StrMap vocab;
    PairMap merges;
    int32_t byte_id[256];      // the id of each byte's one-character piece
    char byte_char[256][3];    // byte -> its mapped character, UTF-8, NUL-terminated
    int16_t char_byte[0x144];  // mapped code point -> byte, -1 if none
    AddedToken *added;         // [n_added] longest first
    int n_added;
    bool added_first_byte[256];
    pcre2_code *regexes[MAX_REGEXES];
    int n_regexes;
    bool nfc;
    bool ignore_merges;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    return x ^ (x >> 33);
}

static size_t table_cap(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

static void strmap_init(StrMap *m, size_t n) {
    m->cap = table_cap(n);
    m->keys = xcalloc(m->cap, sizeof(char *));
    m->values = xcalloc(m->cap, sizeof(int32_t));
}

// Returns the slot of key[0..n): its entry, or the empty slot where it would go.
static size_t strmap_slot(const StrMap *m, const char *key, size_t n) {
    size_t i = hash_bytes(key, n) & (m->cap - 1);
    while (m->keys[i] && !(strlen(m->keys[i]) == n && memcmp(m->keys[i], key, n) == 0))
        i = (i + 1) & (m->cap - 1);
    return i;
}

static int strmap_get(const StrMap *m, const char *key, size_t n) {
    size_t i = strmap_slot(m, key, n);
    return m->keys[i] ? m->values[i] : -1;
}

static void pairmap_init(PairMap *m, size_t n) {
    m->cap = table_cap(n);
    m->keys = xcalloc(m->cap, sizeof(uint64_t));
    m->ranks = xcalloc(m->cap, sizeof(int32_t));
    m->merged = xcalloc(m->cap, sizeof(int32_t));
}

static size_t pairmap_slot(const PairMap *m, int32_t left, int32_t right) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    size_t i = hash_u64(key) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    return i;
}

// The merge of (left, right): its rank, the merged id in *merged; -1 when none.
static int pairmap_get(const PairMap *m, int32_t left, int32_t right, int32_t *merged) {
    size_t i = pairmap_slot(m, left, right);
    if (!m->keys[i]) return -1;
    *merged = m->merged[i];
    return m->ranks[i];
}

static int utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;  // the map's code points are below 0x800
}

// GPT-2's encoder.bytes_to_unicode: printable bytes map to themselves, the others to 256+n.
static void byte_map_init(Bpe *b) {
    int n = 0;
    for (int i = 0; i < 0x144; i++) b->char_byte[i] = -1;
    for (int byte = 0; byte < 256; byte++) {
        bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                         (byte >= 0xAE && byte <= 0xFF);
        uint32_t cp = printable ? (uint32_t)byte : (uint32_t)(256 + n++);
        int len = utf8_put(cp, b->byte_char[byte]);
        b->byte_char[byte][len] = '\0';
        b->char_byte[cp] = (int16_t)byte;
    }
}

static const char *json_type_name(const json_t *j) {
    const char *type = json_string_value(json_object_get(j, "type"));
    return type ? type : "(no type)";
}

static bool json_is_true_key(const json_t *j, const char *key) {
    return json_is_true(json_object_get(j, key));
}

static int add_regex(Bpe *b, const char *pattern, const char *path, char *err, size_t err_len) {
    if (b->n_regexes == MAX_REGEXES)
        return fail_at(err, err_len, path, 0, "more than %d Split pre-tokenizers", MAX_REGEXES);
    int code;
    PCRE2_SIZE offset;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &code, &offset, NULL);
    if (!re) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(code, message, sizeof message);
        return fail_at(err, err_len, path, 0, "pre_tokenizer regex '%s': %s at %zu", pattern,
                       (const char *)message, (size_t)offset);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // without JIT the interpreter runs
    b->regexes[b->n_regexes++] = re;
    return 0;
}

static int parse_normalizer(Bpe *b, const json_t *n, const char *path, char *err, size_t err_len) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_type_name(n);
    if (strcmp(type, "NFC") == 0) {
        b->nfc = true;
        return 0;
    }
    if (strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *item;
        json_array_foreach(json_object_get(n, "normalizers"), i, item)
            if (parse_normalizer(b, item, path, err, err_len) != 0) return -1;
        return 0;
    }
    return fail_at(err, err_len, path, 0, "normalizer '%s' is not implemented (NFC only)", type);
}

static int parse_byte_level(Bpe *b, const json_t *p, bool last, const char *path, char *err,
                            size_t err_len) {
    if (!last) return fail_at(err, err_len, path, 0, "pre_tokenizer ByteLevel before another one");
    if (json_is_true_key(p, "add_prefix_space"))
        return fail_at(err, err_len, path, 0, "pre_tokenizer ByteLevel add_prefix_space is not implemented");
    const json_t *use_regex = json_object_get(p, "use_regex");
    if (!use_regex || json_is_true(use_regex)) return add_regex(b, GPT2_PATTERN, path, err, err_len);
    return 0;
}

static int parse_split(Bpe *b, const json_t *p, const char *path, char *err, size_t err_len) {
    const char *pattern = json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
    const char *behavior = json_string_value(json_object_get(p, "behavior"));
    if (!pattern) return fail_at(err, err_len, path, 0, "pre_tokenizer Split without a Regex pattern");
    if (!behavior || strcmp(behavior, "Isolated") != 0 || json_is_true_key(p, "invert"))
        return fail_at(err, err_len, path, 0, "pre_tokenizer Split behavior '%s'%s is not implemented "
                       "(Isolated only)", behavior ? behavior : "null",
                       json_is_true_key(p, "invert") ? " inverted" : "");
    return add_regex(b, pattern, path, err, err_len);
}

static int parse_pre_tokenizer(Bpe *b, const json_t *p, const char *path, char *err, size_t err_len) {
    const char *type = json_type_name(p);
    if (strcmp(type, "ByteLevel") == 0) return parse_byte_level(b, p, true, path, err, err_len);
    if (strcmp(type, "Sequence") != 0)
        return fail_at(err, err_len, path, 0, "pre_tokenizer '%s' is not implemented", type);
    const json_t *list = json_object_get(p, "pretokenizers");
    size_t n = json_array_size(list);
    for (size_t i = 0; i < n; i++) {
        const json_t *item = json_array_get(list, i);
        const char *item_type = json_type_name(item);
        int rc = strcmp(item_type, "Split") == 0       ? parse_split(b, item, path, err, err_len)
                 : strcmp(item_type, "ByteLevel") == 0 ? parse_byte_level(b, item, i + 1 == n, path, err, err_len)
                 : fail_at(err, err_len, path, 0, "pre_tokenizer '%s' is not implemented", item_type);
        if (rc != 0) return -1;
    }
    if (n == 0 || strcmp(json_type_name(json_array_get(list, n - 1)), "ByteLevel") != 0)
        return fail_at(err, err_len, path, 0, "pre_tokenizer Sequence does not end in ByteLevel");
    return 0;
}

static int parse_model_options(const json_t *m, const char *path, char *err, size_t err_len) {
    if (strcmp(json_type_name(m), "BPE") != 0)
        return fail_at(err, err_len, path, 0, "model type '%s' is not implemented (BPE only)",
                       json_type_name(m));
    const json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout))
        return fail_at(err, err_len, path, 0, "BPE dropout is not implemented");
    if (json_is_true_key(m, "byte_fallback"))
        return fail_at(err, err_len, path, 0, "BPE byte_fallback is not implemented (byte-level BPE only)");
    static const char *const AFFIXES[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *affix = json_string_value(json_object_get(m, AFFIXES[i]));
        if (affix && *affix)
            return fail_at(err, err_len, path, 0, "BPE %s is not implemented", AFFIXES[i]);
    }
    return 0;
}

static void set_piece(Bpe *b, int id, const char *piece, size_t len) {
    free(b->pieces[id]);
    b->pieces[id] = xmalloc(len + 1);
    memcpy(b->pieces[id], piece, len);
    b->pieces[id][len] = '\0';
}

// The string map over every id's piece (rebuilt when tokens are added).
static void vocab_map_build(Bpe *b) {
    free(b->vocab.keys), free(b->vocab.values);
    strmap_init(&b->vocab, (size_t)b->vocab_size);
    for (int id = 0; id < b->vocab_size; id++) {
        if (!b->pieces[id]) continue;
        size_t slot = strmap_slot(&b->vocab, b->pieces[id], strlen(b->pieces[id]));
        b->vocab.keys[slot] = b->pieces[id];
        b->vocab.values[slot] = id;
    }
}

// The vocabulary and the added tokens: ids, pieces and the string map.
static int parse_vocab(Bpe *b, const json_t *vocab, const json_t *added, const char *path,
                       char *err, size_t err_len) {
    int max_id = -1;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)vocab, key, value) {
        json_int_t id = json_integer_value(value);
        if (!json_is_integer(value) || id < 0 || id >= (1 << 24))
            return fail_at(err, err_len, path, 0, "vocab entry '%s' has no valid id", key);
        if (id > max_id) max_id = (int)id;
    }
    size_t i;
    json_array_foreach((json_t *)added, i, value) {
        json_int_t id = json_integer_value(json_object_get(value, "id"));
        if (!json_is_string(json_object_get(value, "content")) || id < 0 || id >= (1 << 24))
            return fail_at(err, err_len, path, 0, "added_tokens[%zu] has no content or valid id", i);
        static const char *const OPTIONS[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++)
            if (json_is_true_key(value, OPTIONS[k]))
                return fail_at(err, err_len, path, 0, "added_tokens[%zu] %s is not implemented", i, OPTIONS[k]);
        if (id > max_id) max_id = (int)id;
    }
    b->vocab_size = max_id + 1;
    b->pieces = xcalloc((size_t)b->vocab_size, sizeof(char *));
    b->is_added = xcalloc((size_t)b->vocab_size, sizeof(bool));
    json_object_foreach((json_t *)vocab, key, value)
        set_piece(b, (int)json_integer_value(value), key, strlen(key));
    b->n_added = (int)json_array_size(added);
    b->added = xcalloc((size_t)b->n_added, sizeof(AddedToken));
    json_array_foreach((json_t *)added, i, value) {
        const char *content = json_string_value(json_object_get(value, "content"));
        AddedToken *t = &b->added[i];
        t->len = strlen(content);
        if (t->len == 0) return fail_at(err, err_len, path, 0, "added_tokens[%zu] is empty", i);
        t->content = xmalloc(t->len + 1);
        memcpy(t->content, content, t->len + 1);
        t->id = (int32_t)json_integer_value(json_object_get(value, "id"));
        set_piece(b, t->id, content, t->len);
        b->is_added[t->id] = true;
        b->added_first_byte[(unsigned char)content[0]] = true;
    }
    vocab_map_build(b);
    return 0;
}

static int by_length_desc(const void *a, const void *b) {
    size_t la = ((const AddedToken *)a)->len, lb = ((const AddedToken *)b)->len;
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static int parse_merges(Bpe *b, const json_t *merges, const char *path, char *err, size_t err_len) {
    size_t n = json_array_size(merges);
    pairmap_init(&b->merges, n);
    char joined[1024];
    for (size_t r = 0; r < n; r++) {
        const json_t *m = json_array_get(merges, r);
        const char *left = NULL, *right = NULL, *text = json_string_value(m);
        size_t left_len = 0;
        if (text) {  // "a b"
            const char *space = strchr(text, ' ');
            if (space) left = text, left_len = (size_t)(space - text), right = space + 1;
        } else if (json_array_size(m) == 2) {  // ["a", "b"]
            left = json_string_value(json_array_get(m, 0));
            right = json_string_value(json_array_get(m, 1));
            left_len = left ? strlen(left) : 0;
        }
        if (!left || !right || left_len + strlen(right) >= sizeof joined)
            return fail_at(err, err_len, path, 0, "merges[%zu] is not a pair of pieces", r);
        memcpy(joined, left, left_len);
        strcpy(joined + left_len, right);
        int a = strmap_get(&b->vocab, left, left_len), c = strmap_get(&b->vocab, right, strlen(right));
        int merged = strmap_get(&b->vocab, joined, strlen(joined));
        if (a < 0 || c < 0 || merged < 0)
            return fail_at(err, err_len, path, 0, "merges[%zu] '%s' names a piece not in the vocab",
                           r, text ? text : joined);
        size_t slot = pairmap_slot(&b->merges, a, c);
        if (b->merges.keys[slot]) continue;  // a repeated merge keeps its first rank
        b->merges.keys[slot] = ((uint64_t)(uint32_t)a << 32 | (uint32_t)c) + 1;
        b->merges.ranks[slot] = (int32_t)r;
        b->merges.merged[slot] = merged;
    }
    return 0;
}

static int parse(Bpe *b, const json_t *root, const char *path, char *err, size_t err_len) {
    const json_t *model = json_object_get(root, "model");
    const json_t *decoder = json_object_get(root, "decoder");
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    if (!json_is_object(model)) return fail_at(err, err_len, path, 0, "no \"model\" object");
    if (parse_model_options(model, path, err, err_len) != 0 ||
        parse_normalizer(b, json_object_get(root, "normalizer"), path, err, err_len) != 0)
        return -1;
    if (!json_is_object(pre))
        return fail_at(err, err_len, path, 0, "pre_tokenizer null is not implemented (ByteLevel)");
    if (parse_pre_tokenizer(b, pre, path, err, err_len) != 0) return -1;
    if (!json_is_object(decoder) || strcmp(json_type_name(decoder), "ByteLevel") != 0)
        return fail_at(err, err_len, path, 0, "decoder '%s' is not implemented (ByteLevel only)",
                       json_is_object(decoder) ? json_type_name(decoder) : "null");
    b->ignore_merges = json_is_true_key(model, "ignore_merges");
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return fail_at(err, err_len, path, 0, "model has no vocab object");
    if (parse_vocab(b, vocab, json_object_get(root, "added_tokens"), path, err, err_len) != 0 ||
        parse_merges(b, json_object_get(model, "merges"), path, err, err_len) != 0)
        return -1;
    qsort(b->added, (size_t)b->n_added, sizeof(AddedToken), by_length_desc);
    byte_map_init(b);
    for (int byte = 0; byte < 256; byte++) {
        b->byte_id[byte] = strmap_get(&b->vocab, b->byte_char[byte], strlen(b->byte_char[byte]));
        if (b->byte_id[byte] < 0)
            return fail_at(err, err_len, path, 0, "the vocab lacks byte 0x%02X (not byte-level)", byte);
    }
    return 0;
}

Bpe *bpe_load(const char *path, char *err, size_t err_len) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        fail_at(err, err_len, path, jerr.line, "%s", jerr.text);
        return NULL;
    }
    Bpe *b = xcalloc(1, sizeof(Bpe));
    int rc = parse(b, root, path, err, err_len);
    json_decref(root);
    if (rc != 0) {
        bpe_free(b);
        return NULL;
    }
    return b;
}

void bpe_free(Bpe *b) {
    if (!b) return;
    for (int id = 0; id < b->vocab_size; id++) free(b->pieces[id]);
    for (int i = 0; i < b->n_added; i++) free(b->added[i].content);
    for (int i = 0; i < b->n_regexes; i++) pcre2_code_free(b->regexes[i]);
    free(b->pieces), free(b->is_added), free(b->added);
    free(b->vocab.keys), free(b->vocab.values);
    free(b->merges.keys), free(b->merges.ranks), free(b->merges.merged);
    free(b);
}

int bpe_vocab_size(const Bpe *b) { return b->vocab_size; }

void bpe_add_tokens(Bpe *b, const char *const *tokens, int n, int32_t *ids) {
    b->pieces = xrealloc(b->pieces, (size_t)(b->vocab_size + n) * sizeof(char *));
    b->is_added = xrealloc(b->is_added, (size_t)(b->vocab_size + n) * sizeof(bool));
    b->added = xrealloc(b->added, (size_t)(b->n_added + n) * sizeof(AddedToken));
    for (int i = 0; i < n; i++) {
        AddedToken *t = &b->added[b->n_added++];
        t->len = strlen(tokens[i]);
        CHECK(t->len > 0, "an empty added token");
        // A piece of the vocabulary keeps its id (as tokenizers::AddedVocabulary does).
        int id = strmap_get(&b->vocab, tokens[i], t->len);
        if (id < 0) {
            id = b->vocab_size++;
            b->pieces[id] = NULL;
            set_piece(b, id, tokens[i], t->len);
        }
        t->content = xmalloc(t->len + 1);
        memcpy(t->content, tokens[i], t->len + 1);
        t->id = ids[i] = id;
        b->is_added[id] = true;
        b->added_first_byte[(unsigned char)tokens[i][0]] = true;
    }
    qsort(b->added, (size_t)b->n_added, sizeof(AddedToken), by_length_desc);
    vocab_map_build(b);
}

// ---------------------------------------------------------------------------------
// Encoding

typedef struct {
    int32_t *ids;
    int n, cap;      // ids[0..min(n, cap)) written; n counts every id
} IdSink;

static void emit(IdSink *out, int32_t id) {
    if (out->n < out->cap) out->ids[out->n] = id;
    out->n++;
}

typedef struct {
    int32_t rank, pos, merged;
} MergeEntry;

// The per-call scratch of the merge loop, grown as needed.
typedef struct {
    int32_t *sym, *prev, *next;  // [cap] the word's symbols as a linked list
    MergeEntry *heap;            // [3 * cap] pending merges, a min-heap on (rank, pos)
    int cap, n_heap;
    char *mapped;                // [6 * cap] ignore_merges: the word in the mapped alphabet
} Scratch;

static bool entry_less(MergeEntry a, MergeEntry b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(Scratch *s, MergeEntry e) {
    int i = s->n_heap++;
    while (i > 0 && entry_less(e, s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
}

static MergeEntry heap_pop(Scratch *s) {
    MergeEntry top = s->heap[0], last = s->heap[--s->n_heap];
    int i = 0;
    for (;;) {
        int child = 2 * i + 1;
        if (child >= s->n_heap) break;
        if (child + 1 < s->n_heap && entry_less(s->heap[child + 1], s->heap[child])) child++;
        if (!entry_less(s->heap[child], last)) break;
        s->heap[i] = s->heap[child];
        i = child;
    }
    s->heap[i] = last;
    return top;
}

static void push_pair(const Bpe *b, Scratch *s, int pos) {
    int32_t merged;
    int rank = pairmap_get(&b->merges, s->sym[pos], s->sym[s->next[pos]], &merged);
    if (rank >= 0) heap_push(s, (MergeEntry){rank, pos, merged});
}

static void scratch_reserve(Scratch *s, int n) {
    if (n <= s->cap) return;
    s->cap = n;
    s->sym = xrealloc(s->sym, (size_t)n * sizeof(int32_t));
    s->prev = xrealloc(s->prev, (size_t)n * sizeof(int32_t));
    s->next = xrealloc(s->next, (size_t)n * sizeof(int32_t));
    s->heap = xrealloc(s->heap, 3 * (size_t)n * sizeof(MergeEntry));
    s->mapped = xrealloc(s->mapped, 6 * (size_t)n + 1);
}

// One pre-token: bytes -> mapped symbols -> merges by rank.
static void encode_word(const Bpe *b, Scratch *s, const unsigned char *w, int n, IdSink *out) {
    scratch_reserve(s, n);
    if (b->ignore_merges) {
        size_t len = 0;
        for (int i = 0; i < n; i++) {
            size_t k = strlen(b->byte_char[w[i]]);
            memcpy(s->mapped + len, b->byte_char[w[i]], k);
            len += k;
        }
        int id = strmap_get(&b->vocab, s->mapped, len);
        if (id >= 0) return emit(out, id);
    }
    s->n_heap = 0;
    for (int i = 0; i < n; i++) {
        s->sym[i] = b->byte_id[w[i]];
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < n ? i + 1 : -1;
    }
    for (int i = 0; i + 1 < n; i++) push_pair(b, s, i);
    while (s->n_heap > 0) {
        MergeEntry e = heap_pop(s);
        int right = s->next[e.pos];
        if (s->sym[e.pos] < 0 || right < 0) continue;  // merged away, or the last symbol
        int32_t merged;
        if (pairmap_get(&b->merges, s->sym[e.pos], s->sym[right], &merged) < 0 || merged != e.merged)
            continue;  // stale: one side changed since the entry was pushed
        s->sym[e.pos] = merged;
        s->sym[right] = -1;
        s->next[e.pos] = s->next[right];
        if (s->next[right] >= 0) s->prev[s->next[right]] = e.pos;
        if (s->prev[e.pos] >= 0) push_pair(b, s, s->prev[e.pos]);
        if (s->next[e.pos] >= 0) push_pair(b, s, e.pos);
    }
    for (int i = 0; i >= 0; i = s->next[i]) emit(out, s->sym[i]);
}

// Splits text[0..len) with regexes[level..] (Isolated: matches and the gaps between them
// are pre-tokens) and encodes each pre-token. Returns -1 on a regex error (invalid UTF-8).
static int split_and_encode(const Bpe *b, Scratch *s, pcre2_match_data *md, const char *text,
                            size_t len, int level, IdSink *out) {
    if (len == 0) return 0;
    if (level == b->n_regexes) {
        encode_word(b, s, (const unsigned char *)text, (int)len, out);
        return 0;
    }
    size_t at = 0, gap = 0;
    uint32_t options = 0;  // the first match checks the UTF-8, the others skip it
    while (at <= len) {
        int rc = pcre2_match(b->regexes[level], (PCRE2_SPTR)text, len, at, options, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return -1;
        options = PCRE2_NO_UTF_CHECK;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t start = ov[0], end = ov[1];
        if (end == start) {  // an empty match: step one character
            at = end + 1;
            while (at < len && ((unsigned char)text[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (split_and_encode(b, s, md, text + gap, start - gap, level + 1, out) != 0 ||
            split_and_encode(b, s, md, text + start, end - start, level + 1, out) != 0)
            return -1;
        at = gap = end;
    }
    return split_and_encode(b, s, md, text + gap, len - gap, level + 1, out);
}

// A stretch of text between added tokens: normalized, then pre-tokenized and merged.
static int encode_stretch(const Bpe *b, Scratch *s, pcre2_match_data *md, const char *text,
                          size_t len, IdSink *out) {
    if (len == 0) return 0;
    bool ascii = true;  // ASCII is its own NFC
    for (size_t i = 0; i < len && ascii; i++) ascii = (unsigned char)text[i] < 0x80;
    if (!b->nfc || ascii) return split_and_encode(b, s, md, text, len, 0, out);
    utf8proc_uint8_t *normal = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &normal,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0) return -1;
    int rc = split_and_encode(b, s, md, (const char *)normal, (size_t)n, 0, out);
    free(normal);
    return rc;
}

// The added token starting at text[0..len), longest first; NULL when none.
static const AddedToken *added_at(const Bpe *b, const char *text, size_t len) {
    if (!b->added_first_byte[(unsigned char)text[0]]) return NULL;
    for (int i = 0; i < b->n_added; i++) {
        const AddedToken *t = &b->added[i];
        if (t->len <= len && memcmp(text, t->content, t->len) == 0) return t;
    }
    return NULL;
}

int bpe_encode(const Bpe *b, const char *text, size_t len, int plain, int32_t *ids, int cap) {
    IdSink out = {ids, 0, cap};
    Scratch s = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = 0;
    size_t stretch = 0;
    for (size_t i = 0; !plain && i < len && rc == 0; i++) {
        const AddedToken *t = added_at(b, text + i, len - i);
        if (!t) continue;
        rc = encode_stretch(b, &s, md, text + stretch, i - stretch, &out);
        emit(&out, t->id);
        stretch = i + t->len;
        i = stretch - 1;
    }
    if (rc == 0) rc = encode_stretch(b, &s, md, text + stretch, len - stretch, &out);
    pcre2_match_data_free(md);
    free(s.sym), free(s.prev), free(s.next), free(s.heap), free(s.mapped);
    return rc != 0 ? -1 : out.n;
}

// ---------------------------------------------------------------------------------
// Decoding and pieces

char *bpe_decode(const Bpe *b, const int32_t *ids, int n) {
    size_t total = 1;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= b->vocab_size || !b->pieces[ids[i]]) return NULL;
        total += strlen(b->pieces[ids[i]]);
    }
    char *out = xmalloc(total), *p = out;
    for (int i = 0; i < n; i++) {
        const char *piece = b->pieces[ids[i]];
        if (b->is_added[ids[i]]) {
            size_t k = strlen(piece);
            memcpy(p, piece, k);
            p += k;
            continue;
        }
        // Mapped characters back to bytes; anything else is copied as it is.
        for (const unsigned char *c = (const unsigned char *)piece; *c;) {
            uint32_t cp = *c;
            int k = 1;
            if ((*c & 0xE0) == 0xC0 && (c[1] & 0xC0) == 0x80) cp = (uint32_t)(*c & 0x1F) << 6 | (c[1] & 0x3F), k = 2;
            if (cp < 0x144 && b->char_byte[cp] >= 0) {
                *p++ = (char)b->char_byte[cp];
            } else {
                memcpy(p, c, (size_t)k);
                p += k;
            }
            c += k;
        }
    }
    *p = '\0';
    return out;
}

int bpe_piece_to_id(const Bpe *b, const char *piece) {
    return strmap_get(&b->vocab, piece, strlen(piece));
}

const char *bpe_id_to_piece(const Bpe *b, int id) {
    return id >= 0 && id < b->vocab_size ? b->pieces[id] : NULL;
}
