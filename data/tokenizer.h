// One tokenizer C API over two backends (data/tokenizer.cc is the only C++ file):
//   - a SentencePiece `.model`,
//   - a Hugging Face `tokenizer.json` with a byte-level BPE model (data/bpe.h),
//   - a model folder: its tokenizer.json, else its tokenizer.model (also when the folder
//     has both and the tokenizer.json needs what is not implemented, e.g. Llama-2's
//     byte-fallback BPE: then a note on stderr says so).
#pragma once
#include <stdint.h>
#include <stddef.h>

typedef struct Tokenizer Tokenizer;

// Returns NULL and writes a message (naming the path) into err when the tokenizer
// cannot be loaded: a missing path, a folder without either file, or a tokenizer.json
// asking for something not implemented (named).
Tokenizer *tokenizer_load(const char *path, char *err, size_t err_len);
void tokenizer_free(Tokenizer *t);
int tokenizer_vocab_size(const Tokenizer *t);
// Adds tokens (non-empty, none of them yet one id here) as added tokens, with the ids
// the reference tokenizers' add_tokens gives: a vocabulary piece's own id, else the next
// id after the vocabulary (tokenizer.json only: a SentencePiece model is refused, naming
// the first token). Returns 0, or -1 with a message in err.
int tokenizer_add_tokens(Tokenizer *t, const char *const *tokens, int n, char *err, size_t err_len);
// The ids tokenizer_add_tokens gave, in order (*ids borrowed); returns their number.
int tokenizer_added_ids(const Tokenizer *t, const int32_t **ids);
// The vocabulary size at load: the ids [it, tokenizer_vocab_size) are new ones (added).
int tokenizer_loaded_size(const Tokenizer *t);
// Encodes UTF-8 text the way the model's own tokenizer encodes a whole string: special
// and added tokens are matched anywhere, SentencePiece's dummy prefix is added. Returns
// the number of ids (writes at most cap; call again with a larger buffer if the return
// exceeds cap). Returns -1 on error.
int tokenizer_encode(const Tokenizer *t, const char *text, int32_t *ids, int cap);

// Flags of tokenizer_encode_flags.
enum {
    // Special and added tokens' strings are ordinary text: the ids never contain a
    // control id that the text spells (text fields of the data, DESIGN.md §8).
    TOKENIZER_PLAIN = 1,
    // The text continues a sequence already begun: no SentencePiece dummy prefix, so
    // parts encoded one after another give the ids of encoding them joined.
    TOKENIZER_CONTINUE = 2,
};
// tokenizer_encode with TOKENIZER_* flags; the same return convention.
int tokenizer_encode_flags(const Tokenizer *t, const char *text, unsigned flags, int32_t *ids,
                           int cap);
// Decodes ids into a malloc'd NUL-terminated string; NULL when an id is out of range.
char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n);
int tokenizer_piece_to_id(const Tokenizer *t, const char *piece);  // -1 if unknown
const char *tokenizer_id_to_piece(const Tokenizer *t, int id);

// Trains a SentencePiece model from a UTF-8 text corpus (one sentence per line) with the
// template's control tokens as user-defined symbols (ids 1..n, in the template's order).
// Writes <model_prefix>.model. Returns 0 on success, -1 with a message in err.
struct ChatTemplate;
int tokenizer_train(const char *corpus_path, const char *model_prefix, int vocab_size,
                    const struct ChatTemplate *t, char *err, size_t err_len);
