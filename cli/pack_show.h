// `train pack --show N`: sample N's documents as packed, in text and token by token.
#pragma once
#include <stdio.h>

#include "data/batch.h"
#include "data/tokenizer.h"

// Prints the documents of the sample on line `line` of the data file as `train pack`
// wrote them: where each lies in the rows, its rendered text cut into segments at each
// change of turn, role or training ("[turn 1 think, trained]": its tokens are loss
// targets; "context": they are not), then one line per token: slot, position, turn, role
// (prompt: system, user and tool text and the template's headers; history: the
// duplicate layout's untrained answer copy), token id and piece, and its target (the id
// and piece this slot is trained to predict) or "-". Returns the number of documents printed (0: no such sample).
int pack_show_sample(const PackedDataset *data, const Tokenizer *tok, int line, FILE *f);
