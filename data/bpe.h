// Hugging Face tokenizer.json, byte-level BPE, in C (the GPT-2, Llama-3 and Qwen2
// family). What is implemented; anything else in the file is refused by name:
//   normalizer     null or NFC (utf8proc), alone or in a Sequence
//   pre_tokenizer  ByteLevel (use_regex: the GPT-2 regex; add_prefix_space false), or a
//                  Sequence of Split (a regex, behavior Isolated, not inverted; PCRE2
//                  with UTF and Unicode properties) ending in ByteLevel(use_regex false)
//   model          BPE without dropout, byte fallback, subword prefix or word suffix;
//                  merges as "a b" strings or ["a", "b"] pairs; ignore_merges
//   decoder        ByteLevel
//   added_tokens   special or not, matched leftmost-longest on the raw text before
//                  normalization and pre-tokenization (no lstrip, rstrip, single_word;
//                  "normalized": true ones are matched on the raw text too, which under
//                  NFC differs only where the text's NFC spells the token and the text
//                  itself does not, e.g. a decomposed accent inside a token)
// The post-processor is ignored: onepass never adds tokens around a text (the template
// does).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Bpe Bpe;

// Returns NULL with a message (naming the path and what is refused) in err.
Bpe *bpe_load(const char *path, char *err, size_t err_len);
void bpe_free(Bpe *b);
int bpe_vocab_size(const Bpe *b);
// Adds tokens (non-empty, none yet one id when encoded) as added tokens, matched like the
// file's own, with the ids the reference's add_tokens gives (into ids[n]): a token that is
// a piece of the vocabulary keeps that piece's id, the others get vocab_size, + 1, ...
void bpe_add_tokens(Bpe *b, const char *const *tokens, int n, int32_t *ids);
// Encodes text[0..len); plain: added tokens' strings are ordinary text. Returns the
// number of ids (writes at most cap), or -1 on invalid UTF-8.
int bpe_encode(const Bpe *b, const char *text, size_t len, int plain, int32_t *ids, int cap);
// A malloc'd NUL-terminated string, or NULL when an id is out of range.
char *bpe_decode(const Bpe *b, const int32_t *ids, int n);
int bpe_piece_to_id(const Bpe *b, const char *piece);  // -1 if unknown
const char *bpe_id_to_piece(const Bpe *b, int id);     // NULL if out of range
