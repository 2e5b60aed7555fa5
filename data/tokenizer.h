// C API over SentencePiece (data/tokenizer.cc is the only C++ file).
#pragma once
#include <stdint.h>
#include <stddef.h>

typedef struct Tokenizer Tokenizer;

// Returns NULL and writes a message into err when the model cannot be loaded.
Tokenizer *tokenizer_load(const char *model_path, char *err, size_t err_len);
void tokenizer_free(Tokenizer *t);
int tokenizer_vocab_size(const Tokenizer *t);
// Encodes UTF-8 text; returns the number of ids (writes at most cap; call again
// with a larger buffer if the return exceeds cap). Returns -1 on error.
int tokenizer_encode(const Tokenizer *t, const char *text, int32_t *ids, int cap);
// Decodes ids into a malloc'd NUL-terminated string.
char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n);
int tokenizer_piece_to_id(const Tokenizer *t, const char *piece);  // -1 if unknown
const char *tokenizer_id_to_piece(const Tokenizer *t, int id);

// Trains a model from a UTF-8 text corpus (one sentence per line) with the chat
// template's special tokens as user-defined symbols. Writes <model_prefix>.model.
// Returns 0 on success, -1 with a message in err.
int tokenizer_train(const char *corpus_path, const char *model_prefix, int vocab_size,
                    char *err, size_t err_len);
