#!/usr/bin/env bash
# docs/CONFIG.md is what `train config --markdown` prints from the key table, byte for byte,
# and `train config` lists every key of the table once.
train="$1"
if ! diff -u docs/CONFIG.md <("$train" config --markdown); then
    echo "FAIL docs/CONFIG.md differs from the key table: run '$train config --markdown > docs/CONFIG.md'"
    exit 1
fi
keys=$(grep -c '^| `' docs/CONFIG.md)
listed=$("$train" config | wc -l)
renamed=$(sed -n '/^## Renamed keys/,$p' docs/CONFIG.md | grep -c '^| `')
if [ "$listed" -ne $((keys - renamed)) ]; then
    echo "FAIL train config lists $listed keys, docs/CONFIG.md $((keys - renamed))"; exit 1
fi
echo "docs/CONFIG.md matches the key table ($listed keys)"
