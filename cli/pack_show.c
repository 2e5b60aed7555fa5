// `train pack --show N` (cli/pack_show.h).
#include "cli/pack_show.h"

#include <stdlib.h>
#include <string.h>

static const char *role_name(int role) {
    switch (role) {
    case ROLE_PROMPT: return "prompt";
    case ROLE_THINK: return "think";
    case ROLE_ANSWER: return "answer";
    case ROLE_ANSWER_HISTORY: return "history";
    default: return "pad";
    }
}

// A piece with its control bytes, quotes and backslashes escaped, in double quotes.
static void print_piece(FILE *f, const Tokenizer *tok, int id, int width) {
    const char *p = id >= 0 && id < tokenizer_vocab_size(tok) ? tokenizer_id_to_piece(tok, id) : NULL;
    char buf[256];
    size_t n = 0;
    buf[n++] = '"';
    for (const char *s = p ? p : "?"; *s && n < sizeof buf - 8; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n') n += (size_t)snprintf(buf + n, sizeof buf - n, "\\n");
        else if (c == '\t') n += (size_t)snprintf(buf + n, sizeof buf - n, "\\t");
        else if (c == '"' || c == '\\') n += (size_t)snprintf(buf + n, sizeof buf - n, "\\%c", c);
        else if (c < 0x20) n += (size_t)snprintf(buf + n, sizeof buf - n, "\\x%02x", c);
        else buf[n++] = (char)c;
    }
    buf[n++] = '"';
    buf[n] = '\0';
    int cols = 0;  // display columns: UTF-8 lead bytes
    for (size_t i = 0; i < n; i++) cols += ((unsigned char)buf[i] & 0xC0) != 0x80;
    fputs(buf, f);
    for (; cols < width; cols++) fputc(' ', f);
}

// The slot of row `row` where document d starts, or -1.
static int find_doc(const PackedRows *rows, int d, int *row_out) {
    for (int r = 0; r < rows->n_rows; r++)
        for (int s = 0; s < rows->seq_len; s++)
            if (rows->doc[(size_t)r * (size_t)rows->seq_len + (size_t)s] == d) {
                *row_out = r;
                return s;
            }
    return -1;
}

static void print_document(const PackedDataset *data, const Tokenizer *tok, int d, FILE *f) {
    const PackedRows *rows = &data->rows;
    int row = 0;
    const int start = find_doc(rows, d, &row);
    if (start < 0) {
        fprintf(f, "document %d: not in the rows (skipped)\n", d);
        return;
    }
    const size_t base = (size_t)row * (size_t)rows->seq_len;
    int n = 0, n_trained = 0;
    while (start + n < rows->seq_len && rows->doc[base + (size_t)(start + n)] == d) {
        n_trained += rows->target[base + (size_t)(start + n)] >= 0;
        n++;
    }
    const int32_t *token = rows->token + base + start, *target = rows->target + base + start;
    const int32_t *turn = rows->turn + base + start, *role = rows->role + base + start;
    fprintf(f, "document %d: row %d, slots %d..%d, %d tokens, %d trained\n", d, row, start,
            start + n - 1, n, n_trained);

    // The text, one segment per run of tokens of one turn, role and training: a token is
    // trained when it is a loss target, i.e. the slot before it has a target.
#define LEARNED(i) ((i) > 0 && target[(i) - 1] >= 0)
    fputs("text:\n", f);
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && turn[j] == turn[i] && role[j] == role[i] && LEARNED(j) == LEARNED(i)) j++;
        char *text = tokenizer_decode(tok, token + i, j - i);
        fprintf(f, "[turn %d %s, %s]%s", turn[i], role_name(role[i]),
                LEARNED(i) ? "trained" : "context", text ? text : "");
        free(text);
        i = j;
    }
#undef LEARNED
    fputs("\n\n", f);

    // target: the token this slot is trained to predict (the next slot's), "-" for none.
    fprintf(f, "%6s %6s %4s %-8s %7s %-24s %7s %s\n", "slot", "pos", "turn", "role", "token",
            "piece", "target", "target piece");
    for (int i = 0; i < n; i++) {
        const size_t at = base + (size_t)(start + i);
        fprintf(f, "%6d %6d %4d %-8s %7d ", start + i, rows->pos[at], turn[i], role_name(role[i]),
                token[i]);
        print_piece(f, tok, token[i], 24);
        if (target[i] >= 0) {
            fprintf(f, " %7d ", target[i]);
            print_piece(f, tok, target[i], 0);
        } else {
            fprintf(f, " %7s", "-");
        }
        fputc('\n', f);
    }
}

int pack_show_sample(const PackedDataset *data, const Tokenizer *tok, int line, FILE *f) {
    int n = 0;
    for (int d = 0; d < data->docs.n_docs; d++) {
        if (data->docs.docs[d].line != line) continue;
        if (n++ == 0) fprintf(f, "\nline %d as packed:\n", line);
        fputc('\n', f);
        print_document(data, tok, d, f);
    }
    return n;
}
