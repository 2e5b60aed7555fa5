// Config: defaults, file merge, --set overrides and type checks.
#include <string.h>
#include "tests/test_util.h"
#include "trainer/config.h"

int main(void) {
    char *sets[] = {"data.seq_len=2048", "data.layout=mask_only", "train.lr=1", "train.resume=abc"};
    Config *c = config_load(NULL, 4, sets);
    EXPECT(config_int(c, "data.seq_len") == 2048, "seq_len %lld", config_int(c, "data.seq_len"));
    EXPECT(strcmp(config_str(c, "data.layout"), "mask_only") == 0, "layout");
    EXPECT(config_num(c, "train.lr") == 1.0, "integer accepted for a real key");
    EXPECT(strcmp(config_str(c, "train.resume"), "abc") == 0, "null default takes a string");
    EXPECT(config_bool(c, "model.tie_word_embeddings"), "default kept");
    char *dump = config_dump(c);
    EXPECT(strstr(dump, "\"seq_len\": 2048") != NULL, "dump shows override: %s", dump);
    free(dump);
    config_free(c);
    return test_finish();
}
