// C API over two backends (data/tokenizer.h): SentencePiece through its C++ library,
// tokenizer.json through data/bpe.c. No C++ exception crosses into C: every entry point
// catches them and reports failure.
//
// Models trained here (tokenizer_train) are SentencePiece byte-level BPE with these ids:
//   0      <unk> (never produced: byte fallback covers every UTF-8 byte)
//   1..6   the onepass template's control tokens, in TEMPLATE_ONEPASS.controls order
//   7..262 the 256 byte pieces <0x00>..<0xFF>
//   263..  learned pieces
// No <s>, </s> or <pad>: the template's own tokens mark turns, and packing pads
// with id 0 under a mask that hides it.
// The text is kept exactly (identity normalization, no dummy "▁" prefix, spaces
// kept), so segments tokenized on their own concatenate to the same text. The
// one SentencePiece limit: a literal U+2581 "▁" in the input decodes as a space.
//
// SentencePiece matches its user-defined symbols anywhere in a text. Plain encoding
// (TOKENIZER_PLAIN) cuts the text after the first character of each occurrence of one, so that no
// piece spells a whole symbol, and encodes the pieces in turn. Continuation encoding
// (TOKENIZER_CONTINUE) of a model with a dummy prefix encodes "<symbol>text" and keeps
// the ids after the symbol: the ids the text gets after a special token in a whole view.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

// The headers are plain C (no extern "C" guards of their own).
extern "C" {
#include "common/check.h"
#include "common/output_file.h"
#include "data/bpe.h"
#include "data/template.h"
#include "data/tokenizer.h"
}

// Exported by libsentencepiece 0.1.97 but missing from its public header; it
// silences the trainer's progress log.
namespace sentencepiece {
namespace logging {
void SetMinLogLevel(int v);
}
}  // namespace sentencepiece

struct Tokenizer {
    Bpe *bpe = nullptr;  // tokenizer.json; else the SentencePiece model below
    sentencepiece::SentencePieceProcessor sp;
    std::vector<std::string> user_symbols;  // SentencePiece's user-defined pieces
    int continue_symbol = -1;  // dummy-prefix models: the symbol continuation encodes after
    int loaded_size = 0;       // the vocabulary size at load; tokenizer_add_tokens adds after it
    std::vector<int32_t> added_ids;  // tokenizer_add_tokens' ids, in order
};

static bool is_regular_file(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const std::string &s, const char *suffix) {
    const size_t n = strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// The file a data.tokenizer path names: itself, or a folder's tokenizer.json, else its
// tokenizer.model. Empty (with a message in err) when there is none.
static std::string resolve_path(const char *path, char *err, size_t err_len) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fail_at(err, err_len, path, 0, "no such file or folder");
        return "";
    }
    if (S_ISDIR(st.st_mode)) {
        for (const char *name : {"tokenizer.json", "tokenizer.model"}) {
            std::string file = std::string(path) + "/" + name;
            if (is_regular_file(file)) return file;
        }
        fail_at(err, err_len, path, 0, "the folder has neither tokenizer.json nor tokenizer.model");
        return "";
    }
    if (!S_ISREG(st.st_mode)) {
        fail_at(err, err_len, path, 0, "not a regular file or a folder");
        return "";
    }
    return path;
}

// Protobuf varint at p (advanced), or false at the end of the buffer.
static bool read_varint(const unsigned char *&p, const unsigned char *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; p < end && shift < 64; shift += 7) {
        *v |= (uint64_t)(*p & 0x7F) << shift;
        if (!(*p++ & 0x80)) return true;
    }
    return false;
}

// One protobuf field at p (advanced past it): its number, and its varint value or its
// length-delimited bytes [*bytes, *bytes + *len). False at the end or on a bad field.
static bool next_field(const unsigned char *&p, const unsigned char *end, uint64_t *number,
                       uint64_t *value, const unsigned char **bytes, uint64_t *len) {
    uint64_t key;
    if (p >= end || !read_varint(p, end, &key)) return false;
    *number = key >> 3;
    *value = 0;
    *bytes = nullptr;
    switch (key & 7) {
    case 0: return read_varint(p, end, value);
    case 1: case 5: {
        const size_t width = (key & 7) == 1 ? 8 : 4;
        if ((size_t)(end - p) < width) return false;
        p += width;
        return true;
    }
    case 2:
        if (!read_varint(p, end, len) || *len > (uint64_t)(end - p)) return false;
        *bytes = p;
        p += *len;
        return true;
    default: return false;
    }
}

// The user-defined pieces of a serialized sentencepiece::ModelProto (the public header has
// no accessor):
// field 1 is the repeated SentencePiece {1: piece, 3: type}, and type 4 is USER_DEFINED.
static std::vector<std::string> user_defined_pieces(const std::string &proto) {
    std::vector<std::string> out;
    const unsigned char *p = (const unsigned char *)proto.data(), *end = p + proto.size();
    uint64_t number, value, len;
    const unsigned char *bytes;
    while (next_field(p, end, &number, &value, &bytes, &len)) {
        if (number != 1 || !bytes) continue;
        const unsigned char *q = bytes, *piece_end = bytes + len, *piece = nullptr;
        uint64_t piece_len = 0, type = 1, n, v, l;
        const unsigned char *b;
        while (next_field(q, piece_end, &n, &v, &b, &l)) {
            if (n == 1 && b) piece = b, piece_len = l;
            if (n == 3 && !b) type = v;
        }
        if (type == 4 && piece && piece_len > 0) out.emplace_back((const char *)piece, (size_t)piece_len);
    }
    return out;
}

static int sp_setup(Tokenizer *t, const std::string &path, char *err, size_t err_len) {
    const auto status = t->sp.Load(path);
    if (!status.ok()) return fail_at(err, err_len, path.c_str(), 0, "%s", status.ToString().c_str());
    t->user_symbols = user_defined_pieces(t->sp.serialized_model_proto());
    // A symbol that begins no longer symbol, so "<symbol>text" splits right after it.
    for (const std::string &symbol : t->user_symbols) {
        bool prefix_of_another = false;
        for (const std::string &other : t->user_symbols)
            prefix_of_another |= other.size() > symbol.size() && other.compare(0, symbol.size(), symbol) == 0;
        std::vector<int> ids;
        if (prefix_of_another || !t->sp.Encode(symbol, &ids).ok()) continue;
        // Two ids ("▁", the symbol): the model adds a dummy prefix.
        if (ids.size() == 2) t->continue_symbol = ids[1];
        break;
    }
    return 0;
}

// One file: a tokenizer.json through data/bpe.c, anything else as a SentencePiece model.
static Tokenizer *load_file(const std::string &file, char *err, size_t err_len) {
    if (input_file_check(file.c_str(), err, err_len) != 0) return nullptr;  // an input: never an output
    Tokenizer *t = new Tokenizer;
    const int rc = ends_with(file, ".json") ? ((t->bpe = bpe_load(file.c_str(), err, err_len)) ? 0 : -1)
                                            : sp_setup(t, file, err, err_len);
    if (rc == 0) {
        t->loaded_size = tokenizer_vocab_size(t);
        return t;
    }
    delete t;
    return nullptr;
}

extern "C" Tokenizer *tokenizer_load(const char *path, char *err, size_t err_len) {
    try {
        const std::string file = resolve_path(path, err, err_len);
        if (file.empty()) return nullptr;
        Tokenizer *t = load_file(file, err, err_len);
        // A folder whose tokenizer.json asks for what data/bpe.c does not implement (the
        // byte-fallback BPE of Llama-2 and TinyLlama) uses the SentencePiece model that
        // file was converted from, saying so.
        const std::string model = std::string(path) + "/tokenizer.model";
        if (!t && file != path && ends_with(file, "tokenizer.json") && is_regular_file(model) &&
            strstr(err, "is not implemented")) {
            fprintf(stderr, "onepass: note: %s; using %s\n", err, model.c_str());
            t = load_file(model, err, err_len);
        }
        return t;
    } catch (...) {
        fail_at(err, err_len, path, 0, "the tokenizer failed to load (out of memory?)");
        return nullptr;
    }
}

extern "C" void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    bpe_free(t->bpe);
    delete t;
}

extern "C" int tokenizer_vocab_size(const Tokenizer *t) {
    return t->bpe ? bpe_vocab_size(t->bpe) : t->sp.GetPieceSize();
}

extern "C" int tokenizer_loaded_size(const Tokenizer *t) { return t->loaded_size; }

extern "C" int tokenizer_add_tokens(Tokenizer *t, const char *const *tokens, int n, char *err,
                                    size_t err_len) {
    if (n == 0) return 0;
    // SentencePiece takes user-defined symbols only when a model is trained.
    if (!t->bpe)
        return fail(err, err_len, "a SentencePiece tokenizer cannot take added tokens ('%s'); use a "
                    "tokenizer.json, or a SentencePiece model trained with them", tokens[0]);
    try {
        const size_t at = t->added_ids.size();
        t->added_ids.resize(at + (size_t)n);
        bpe_add_tokens(t->bpe, tokens, n, t->added_ids.data() + at);
        return 0;
    } catch (...) {
        return fail(err, err_len, "adding tokens failed (out of memory?)");
    }
}

extern "C" int tokenizer_added_ids(const Tokenizer *t, const int32_t **ids) {
    *ids = t->added_ids.data();
    return (int)t->added_ids.size();
}

// One SentencePiece call, appended to out; continuation as described above.
static bool sp_encode_piece(const Tokenizer *t, const std::string &text, bool continuation,
                            std::vector<int> *out) {
    if (text.empty()) return true;
    std::vector<int> ids;
    if (continuation && t->continue_symbol >= 0) {
        if (!t->sp.Encode(t->sp.IdToPiece(t->continue_symbol) + text, &ids).ok()) return false;
        size_t skip = 0;
        while (skip < ids.size() && ids[skip] != t->continue_symbol) skip++;
        out->insert(out->end(), ids.begin() + (long)std::min(skip + 1, ids.size()), ids.end());
        return true;
    }
    if (!t->sp.Encode(text, &ids).ok()) return false;
    out->insert(out->end(), ids.begin(), ids.end());
    return true;
}

static bool sp_encode(const Tokenizer *t, const std::string &text, unsigned flags, std::vector<int> *out) {
    bool continuation = flags & TOKENIZER_CONTINUE;
    if (!(flags & TOKENIZER_PLAIN)) return sp_encode_piece(t, text, continuation, out);
    // Cut every occurrence of a user-defined symbol after its first character.
    std::vector<size_t> cuts;
    for (const std::string &symbol : t->user_symbols) {
        size_t first = 1;
        while (first < symbol.size() && ((unsigned char)symbol[first] & 0xC0) == 0x80) first++;
        for (size_t at = text.find(symbol); at != std::string::npos; at = text.find(symbol, at + 1))
            cuts.push_back(at + first);
    }
    std::sort(cuts.begin(), cuts.end());
    size_t from = 0;
    for (size_t cut : cuts) {
        if (cut <= from) continue;
        if (!sp_encode_piece(t, text.substr(from, cut - from), continuation, out)) return false;
        continuation = true;
        from = cut;
    }
    return sp_encode_piece(t, text.substr(from), continuation, out);
}

extern "C" int tokenizer_encode_flags(const Tokenizer *t, const char *text, unsigned flags,
                                      int32_t *ids, int cap) {
    if (t->bpe) return bpe_encode(t->bpe, text, strlen(text), (flags & TOKENIZER_PLAIN) != 0, ids, cap);
    try {
        std::vector<int> out;
        if (!sp_encode(t, text, flags, &out)) return -1;
        const int n = (int)out.size();
        for (int i = 0; i < n && i < cap; i++) ids[i] = out[i];
        return n;
    } catch (...) {
        return -1;
    }
}

extern "C" int tokenizer_encode(const Tokenizer *t, const char *text, int32_t *ids, int cap) {
    return tokenizer_encode_flags(t, text, 0, ids, cap);
}

extern "C" char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n) {
    if (t->bpe) return bpe_decode(t->bpe, ids, n);
    try {
        std::vector<int> in(ids, ids + n);
        std::string text;
        if (!t->sp.Decode(in, &text).ok()) return nullptr;
        char *out = (char *)malloc(text.size() + 1);
        if (!out) return nullptr;
        memcpy(out, text.c_str(), text.size() + 1);
        return out;
    } catch (...) {
        return nullptr;
    }
}

extern "C" int tokenizer_piece_to_id(const Tokenizer *t, const char *piece) {
    if (t->bpe) return bpe_piece_to_id(t->bpe, piece);
    try {
        const int id = t->sp.PieceToId(piece);
        // SentencePiece maps unknown pieces to the <unk> id.
        if (t->sp.IsUnknown(id) && t->sp.IdToPiece(id) != piece) return -1;
        return id;
    } catch (...) {
        return -1;
    }
}

extern "C" const char *tokenizer_id_to_piece(const Tokenizer *t, int id) {
    if (t->bpe) return bpe_id_to_piece(t->bpe, id);
    if (id < 0 || id >= t->sp.GetPieceSize()) return nullptr;
    return t->sp.IdToPiece(id).c_str();
}

static int train(const char *corpus_path, const char *model_prefix, int vocab_size,
                 const ChatTemplate *t, char *err, size_t err_len) {
    std::string specials;
    for (int i = 0; i < t->n_controls; i++) {
        if (i) specials += ",";
        specials += t->controls[i];
    }
    // BPE rather than unigram: its merges are a deterministic function of the
    // corpus (unigram's EM pruning is not guaranteed to be), and it fills the
    // vocabulary exactly. Digits are split so numbers tokenize digit by digit,
    // matching the digit-level reasoning of the arithmetic data.
    const std::unordered_map<std::string, std::string> args = {
        {"input", corpus_path},
        {"model_prefix", model_prefix},
        {"vocab_size", std::to_string(vocab_size)},
        {"model_type", "bpe"},
        {"character_coverage", "1.0"},
        {"byte_fallback", "true"},
        {"split_digits", "true"},
        {"user_defined_symbols", specials},
        {"unk_id", "0"},
        {"bos_id", "-1"},
        {"eos_id", "-1"},
        {"pad_id", "-1"},
        {"normalization_rule_name", "identity"},
        {"add_dummy_prefix", "false"},
        {"remove_extra_whitespaces", "false"},
        {"num_threads", "1"},
        {"input_sentence_size", "0"},
        {"shuffle_input_sentence", "false"},
        {"max_sentence_length", "65536"},
        {"hard_vocab_limit", "false"},
    };
    sentencepiece::SetRandomGeneratorSeed(1234);
    sentencepiece::logging::SetMinLogLevel(1);
    const auto status = sentencepiece::SentencePieceTrainer::Train(args);
    if (!status.ok())
        return fail(err, err_len, "tokenizer training failed: %s", status.ToString().c_str());
    return 0;
}

extern "C" int tokenizer_train(const char *corpus_path, const char *model_prefix, int vocab_size,
                               const ChatTemplate *t, char *err, size_t err_len) {
    try {
        return train(corpus_path, model_prefix, vocab_size, t, err, err_len);
    } catch (...) {
        return fail(err, err_len, "tokenizer training failed (out of memory?)");
    }
}
