#include "data/template.h"

// Order fixes the ids: the tokenizer registers these as user-defined symbols
// right after <unk>, so they get ids 1..6 in this order.
const char *const TEMPLATE_SPECIAL_TOKENS[] = {
    TEMPLATE_SYSTEM_HEADER, TEMPLATE_USER_HEADER,  TEMPLATE_ASSISTANT_HEADER,
    TEMPLATE_THINK_OPEN,    TEMPLATE_THINK_CLOSE, TEMPLATE_END_OF_TURN,
};
const int TEMPLATE_N_SPECIAL_TOKENS =
    (int)(sizeof(TEMPLATE_SPECIAL_TOKENS) / sizeof(TEMPLATE_SPECIAL_TOKENS[0]));
