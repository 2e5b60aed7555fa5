// A Hugging Face config.json: parsed (hf_config_parse); an accepted one validated by
// model_dims and its parameter table built, as model.init_from does.
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "model/hf_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    HfModelConfig hf;
    char err[1024];
    if (hf_config_parse(text, "config.json", &hf, err, sizeof err) == 0) {
        ParamTable table = {0};
        FUZZ_TRY(param_table_build(&hf.cfg, &table));
        param_table_free(&table);
    }
    free(text);
    return 0;
}
