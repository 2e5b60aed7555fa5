// `train tokenizer` below the command line: a SentencePiece model trained on the
// onepass-template-rendered text of a conversation dataset, with the onepass template's
// control tokens.
#pragma once
#include <stddef.h>
#include "data/conversation.h"
#include "data/tokenizer.h"

// Writes PREFIX.model and PREFIX.vocab (vocab_size pieces) from d's messages and
// completions, through the corpus file PREFIX.corpus.txt (removed after). Fatal when an
// output would overwrite an input of the run or is not a regular file. Returns 0, or -1
// with SentencePiece's message.
int tokenizer_train_on(const Dataset *d, const char *prefix, int vocab_size, char *err,
                       size_t err_len);
