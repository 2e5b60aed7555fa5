// The per-token columns (DESIGN.md §1), in one table. Doc (data/layout.h) and PackedRows
// (data/pack.h) take their members from it, and every loop over the columns is generated
// from it (allocation, padding, copy, free, `train pack`'s JSON keys), so a column is
// added or changed here and nowhere else.
//
//   X(field, json_name, holders, use, padding)
//     field      the member: int32_t *field, [n] in a Doc, [n_rows, seq_len] in PackedRows
//     json_name  its key in `train pack`'s rows (a public interface: keep names and order)
//     holders    DOC_AND_ROW, or ROW_ONLY: only a packed row has it
//     use        MODEL_INPUT: the model reads it (the prefetcher copies these), or TAG:
//                bookkeeping for statistics, the visibility oracle and `train pack`
//     padding    its value in a padding slot; OWN_SLOT for the columns that hold slot
//                indices (lo, hi): padding points at its own slot (lo = hi, visible to
//                nobody), and a document placed at offset o in a row has them moved by o
//
//   token   token id
//   target  next token in this position's own view, -1 = no loss
//   pos     position id (RoPE)
//   lo, hi  key k is visible to query q iff lo[k] <= q < hi[k]; document indices in a
//           Doc, row slots in a packed row
//   doc     index into the DocList, -1 = padding
//   turn    turn index (shared-prefix: 0 = prefix, i+1 = completion i)
//   role    TokenRole (data/layout.h)
#pragma once
#include <stdint.h>

#define TOKEN_COLUMNS(X)                                \
    X(token, "tokens", DOC_AND_ROW, MODEL_INPUT, 0)     \
    X(target, "targets", DOC_AND_ROW, MODEL_INPUT, -1)  \
    X(pos, "pos", DOC_AND_ROW, MODEL_INPUT, 0)          \
    X(lo, "lo", DOC_AND_ROW, MODEL_INPUT, OWN_SLOT)     \
    X(hi, "hi", DOC_AND_ROW, MODEL_INPUT, OWN_SLOT)     \
    X(doc, "doc", ROW_ONLY, TAG, -1)                    \
    X(turn, "turn", DOC_AND_ROW, TAG, -1)               \
    X(role, "role", DOC_AND_ROW, TAG, -1)

// The padding marker of slot-index columns; no column holds a value this negative.
#define OWN_SLOT INT32_MIN

// IF_IN_DOC_##holders(code) and IF_MODEL_INPUT_##use(code) keep code for the columns
// that have the property and drop it for the others.
#define IF_IN_DOC_DOC_AND_ROW(...) __VA_ARGS__
#define IF_IN_DOC_ROW_ONLY(...)
#define IF_MODEL_INPUT_MODEL_INPUT(...) __VA_ARGS__
#define IF_MODEL_INPUT_TAG(...)

// Struct members: TOKEN_COLUMNS(DOC_COLUMN_MEMBER) in Doc, (ROW_COLUMN_MEMBER) in PackedRows.
#define DOC_COLUMN_MEMBER(field, json_name, holders, ...) IF_IN_DOC_##holders(int32_t *field;)
#define ROW_COLUMN_MEMBER(field, ...) int32_t *field;

#define COUNT_MODEL_INPUT(field, json_name, holders, use, ...) IF_MODEL_INPUT_##use(+1)
enum { N_MODEL_INPUT_COLUMNS = 0 TOKEN_COLUMNS(COUNT_MODEL_INPUT) };
#undef COUNT_MODEL_INPUT
