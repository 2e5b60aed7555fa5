#include "trainer/data_options.h"

#include <sys/stat.h>

#include "common/check.h"
#include "model/hf_model.h"

DataOptions data_options_from_config(const RunConfig *c) {
    DataOptions opt = {0};
    const char *layout = c->data.layout;
    int kind = layout_from_name(layout);
    if (kind < 0)
        fatal("config key 'data.layout': unknown layout '%s' (npass, mask_only, duplicate, "
              "shared_prefix, as_rendered, preserve)", layout ? layout : "null");
    opt.layout = (LayoutKind)kind;
    long long seq_len = c->data.seq_len;
    if (seq_len <= 0 || seq_len > (1 << 24))
        fatal("config key 'data.seq_len': must be in 1..%d, got %lld", 1 << 24, seq_len);
    opt.seq_len = (int)seq_len;
    opt.skip_bad = c->data.skip_bad;
    opt.pack.unpacked = c->data.unpacked;
    opt.pack.skip_too_long = c->data.skip_too_long;
    const char *special = c->data.special_in_text;
    int policy = special_in_text_from_name(special);
    if (policy < 0)
        fatal("config key 'data.special_in_text': unknown value '%s' (plain, error)",
              special ? special : "null");
    opt.special_in_text = (SpecialInText)policy;
    opt.chat_template = template_from_config(c);
    opt.ignore_unknown_keys = c->data.ignore_unknown_keys;
    // 0: the default limit, 64 bytes per token of seq_len and at least 1 MiB (README).
    long long max_line = c->data.max_line_bytes;
    long long auto_line = 64 * seq_len > (1 << 20) ? 64 * seq_len : (1 << 20);
    opt.max_line_bytes = (size_t)(max_line > 0 ? max_line : auto_line);
    const char *train_on = c->data.train_on;
    int on = train_on_from_name(train_on);
    if (on < 0)
        fatal("config key 'data.train_on': unknown value '%s' (think_answer, answer)",
              train_on ? train_on : "null");
    opt.loss.train_on = (TrainOn)on;
    opt.loss.skip_empty_think = c->data.skip_empty_think_turns;
    return opt;
}

// data.chat_template, or the folders' template, or onepass (under strip).
static const ChatTemplate *chosen_template(const RunConfig *c) {
    const char *name = c->data.chat_template;
    if (name) {
        const ChatTemplate *t = template_by_name(name);
        if (!t) fatal("config key 'data.chat_template': unknown template '%s' (%s)", name, template_names());
        return t;
    }
    const char *const *folders[] = {&c->data.tokenizer, &c->model.init_from};
    for (int i = 0; i < 2; i++) {
        config_folder_check(c, folders[i]);  // the folder's files are read next
        const ChatTemplate *t;
        char err[4600];
        if (template_of_folder(*folders[i], &t, err, sizeof err) != 0)
            fatal("config key '%s': %s", config_key_of(c, folders[i])->key, err);
        if (t) return t;
    }
    return &TEMPLATE_ONEPASS;
}

const ChatTemplate *template_from_config(const RunConfig *c) {
    const char *history = c->data.history_thinking;
    const int h = history_thinking_from_name(history);
    if (h < 0)
        fatal("config key 'data.history_thinking': unknown value '%s' (strip, keep)",
              history ? history : "null");
    char err[512];
    const ChatTemplate *t = template_with_history(chosen_template(c), (HistoryThinking)h, err, sizeof err);
    if (!t) fatal("config key 'data.history_thinking': %s", err);
    return t;
}

void config_folder_check(const RunConfig *c, const char *const *field) {
    struct stat st;
    char err[4600];
    if (*field && stat(*field, &st) == 0 && S_ISDIR(st.st_mode) &&
        hf_folder_check(*field, err, sizeof err) != 0)
        fatal("config key '%s': %s", config_key_of(c, field)->key, err);
}
