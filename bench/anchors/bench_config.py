"""The model an anchor builds, read as bench_trainer reads it: a benchmark config
(configs/bench_*.json: its model.* keys, or model.init_from's config.json) or a Hugging
Face config.json or its folder."""
import json
import os


def read_config(path):
    """(model config as a Hugging Face config.json has it, data.seq_len or None)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    model = cfg.get("model", cfg)
    if "init_from" in model:
        with open(os.path.join(model["init_from"], "config.json")) as f:
            model = json.load(f)
    return model, cfg.get("data", {}).get("seq_len")
