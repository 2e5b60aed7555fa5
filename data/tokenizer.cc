// C API over SentencePiece (data/tokenizer.h).
//
// Trained models (tokenizer_train) are byte-level BPE with these fixed ids:
//   0      <unk> (never produced: byte fallback covers every UTF-8 byte)
//   1..6   the template's special tokens, in TEMPLATE_SPECIAL_TOKENS order
//   7..262 the 256 byte pieces <0x00>..<0xFF>
//   263..  learned pieces
// No <s>, </s> or <pad>: the template's own tokens mark turns, and packing pads
// with id 0 under a mask that hides it.
// The text is kept exactly (identity normalization, no dummy "▁" prefix, spaces
// kept), so segments tokenized on their own concatenate to the same text. The
// one SentencePiece limit: a literal U+2581 "▁" in the input decodes as a space.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

// The headers are plain C (no extern "C" guards of their own).
extern "C" {
#include "common/check.h"
#include "common/output_file.h"
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
    sentencepiece::SentencePieceProcessor sp;
};

// No C++ exception may cross into C (issue 14): each entry point that can throw (a
// directory read as a model throws std::ios_base::failure, allocation std::bad_alloc)
// catches everything and reports it the C way.
extern "C" Tokenizer *tokenizer_load(const char *model_path, char *err, size_t err_len) {
    if (input_file_check(model_path, err, err_len) != 0) return nullptr;
    Tokenizer *t = nullptr;
    try {
        t = new Tokenizer;
        const auto status = t->sp.Load(model_path);
        if (!status.ok()) {
            fail_at(err, err_len, model_path, 0, "%s", status.ToString().c_str());
            delete t;
            return nullptr;
        }
        return t;
    } catch (const std::exception &e) {
        fail_at(err, err_len, model_path, 0, "cannot load the tokenizer: %s", e.what());
    } catch (...) {
        fail_at(err, err_len, model_path, 0, "cannot load the tokenizer");
    }
    delete t;
    return nullptr;
}

extern "C" void tokenizer_free(Tokenizer *t) { delete t; }

extern "C" int tokenizer_vocab_size(const Tokenizer *t) { return t->sp.GetPieceSize(); }

extern "C" int tokenizer_encode(const Tokenizer *t, const char *text, int32_t *ids, int cap) {
    try {
        std::vector<int> out;
        if (!t->sp.Encode(text, &out).ok()) return -1;
        const int n = (int)out.size();
        for (int i = 0; i < n && i < cap; i++) ids[i] = out[i];
        return n;
    } catch (...) {
        return -1;
    }
}

// Returns NULL when an id is out of range.
extern "C" char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n) {
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
    const int id = t->sp.PieceToId(piece);
    // SentencePiece maps unknown pieces to the <unk> id.
    if (t->sp.IsUnknown(id) && t->sp.IdToPiece(id) != piece) return -1;
    return id;
}

extern "C" const char *tokenizer_id_to_piece(const Tokenizer *t, int id) {
    if (id < 0 || id >= t->sp.GetPieceSize()) return nullptr;
    return t->sp.IdToPiece(id).c_str();
}

extern "C" int tokenizer_train(const char *corpus_path, const char *model_prefix, int vocab_size,
                               char *err, size_t err_len) {
    std::string specials;
    for (int i = 0; i < TEMPLATE_N_SPECIAL_TOKENS; i++) {
        if (i) specials += ",";
        specials += TEMPLATE_SPECIAL_TOKENS[i];
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
    try {
        sentencepiece::SetRandomGeneratorSeed(1234);
        sentencepiece::logging::SetMinLogLevel(1);
        const auto status = sentencepiece::SentencePieceTrainer::Train(args);
        if (!status.ok())
            return fail(err, err_len, "tokenizer training failed: %s", status.ToString().c_str());
        return 0;
    } catch (const std::exception &e) {
        return fail(err, err_len, "tokenizer training failed: %s", e.what());
    } catch (...) {
        return fail(err, err_len, "tokenizer training failed");
    }
}
