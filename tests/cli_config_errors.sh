#!/usr/bin/env bash
# Unknown keys and wrong types are errors that name the file and the key.
train="$1"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
expect_error() {  # expect_error <description> <pattern> <command...>
    local what="$1" pattern="$2"; shift 2
    if out=$("$@" 2>&1); then echo "FAIL $what: exit 0"; fail=$((fail+1)); return; fi
    if grep -q -- "$pattern" <<<"$out"; then pass=$((pass+1)); else echo "FAIL $what: got: $out"; fail=$((fail+1)); fi
}
echo '{"data": {"seq_len": 64, "bogus": 1}}' > "$tmp/unknown.json"
expect_error "unknown key in file" "unknown.json: unknown config key 'data.bogus'" "$train" pack --config "$tmp/unknown.json" --out "$tmp/o"
echo '{"data": {"seq_len": "long"}}' > "$tmp/type.json"
expect_error "wrong type" "type.json: config key 'data.seq_len' must be an integer" "$train" pack --config "$tmp/type.json" --out "$tmp/o"
expect_error "unknown --set key" "unknown config key 'train.nope'" "$train" pack --set train.nope=1 --out "$tmp/o"
echo '{"data": ' > "$tmp/bad.json"
expect_error "invalid JSON" "bad.json:.*invalid JSON" "$train" pack --config "$tmp/bad.json" --out "$tmp/o"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
