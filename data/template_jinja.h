// The official Jinja chat template of each onepass template (data/template.h), as the
// model repositories ship it (onepass: onepass.jinja, written for onepass): what a
// checkpoint carries as chat_template.jinja, so that transformers and vLLM render the
// prompts the model was trained on. data/template_jinja.c is generated from
// tests/data/templates/NAME.jinja by scripts/fixtures/make_template_jinja.py.
#pragma once
#include <stddef.h>

// The text for a template name (ChatTemplate.name); NULL for an unknown name.
const char *template_official_jinja(const char *name);
// The template name whose official text is exactly jinja (a checkpoint's
// chat_template.jinja); NULL for any other text.
const char *template_official_name(const char *jinja);
