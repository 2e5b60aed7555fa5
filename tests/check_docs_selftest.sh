#!/usr/bin/env bash
# tests/check_docs.sh can fail: on a small fake tree it passes, and each stale name or
# history word planted into a copy of that tree makes the check that owns it fail and
# name the plant. Prints each case that went the wrong way and exits 1 when there is one.
set -u
check=$(cd "$(dirname "$0")" && pwd)/check_docs.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GIT_CEILING_DIRECTORIES=$tmp  # the fake trees are read with find, never as a git tree

clean=$tmp/clean
mkdir -p "$clean/common" "$clean/docs" "$clean/tests"
cat >"$clean/common/thing.h" <<'EOF'
// A thing and its count (common/thing.c); thing_count() counts the RealThing's parts.
/* The names a comment uses exist: `real_helper`, RealThing, tests/run.sh. */
typedef struct RealThing { int parts; } RealThing;
int thing_count(const RealThing *t);
static inline int real_helper(void) { return 1; }  // inlined where used
EOF
cat >"$clean/common/thing.c" <<'EOF'
#include "common/thing.h"
int thing_count(const RealThing *t) { return t->parts + real_helper(); }
EOF
cat >"$clean/tests/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the thing's test; writes run_config.json under out_dir.
out_dir=${1:-runs}; echo "$out_dir/run_config.json"
EOF
cat >"$clean/docs/GUIDE.md" <<'EOF'
# The thing

`thing_count()` counts the parts of a `RealThing` (`common/thing.h`, `thing.c`, see
[the header](../common/thing.h) and [the README](../README.md)); a run writes
`run_config.json` and `<out_dir>/metrics.jsonl`, checkpoints `checkpoint-N/`. Keys:
`train.lr`, `data.seq_len`; tensors `model.layers.N.self_attn.q_proj.weight`. Commands:
`./train --config FILE --set train.lr=1e-4`, `bash tests/run.sh`. JSON:
`{"messages": [{"role": "user", "content": "hi"}]}`. Other projects and vendors:
`torch.cuda.max_memory_allocated()`, `flash::NamedBarrier`, `hopper/mainloop_sm90.hpp`,
`__syncthreads`, `cudaMemcpyAsync`, `sm_90`. Maths: `p_t`, `x_i`. Globs:
`tests/test_*.c`, `common/{thing,other}.h`. The thing was measured on 2026-12-01.

```bash
bash tests/run.sh --fast
```
EOF
printf '# The project\n\nSee `docs/GUIDE.md`. Built on PyTorch ideas.\n' >"$clean/README.md"
printf '# Changelog\n\n## 2026-12-01 (14:30 UTC)\n\n- the thing counts parts\n' >"$clean/CHANGELOG.md"

failures=0
# run MODE DIR: the check's exit code; its output in $tmp/out
run() { bash "$check" "$1" "$2" >"$tmp/out" 2>&1; }
fail() { echo "FAIL: $*"; sed 's/^/    /' "$tmp/out"; failures=$((failures + 1)); }

for mode in names history; do
  run "$mode" "$clean" || fail "the clean tree fails the $mode check"
done

# expect MODE FILE LINE WHAT: appending LINE to FILE of a fresh copy makes the MODE
# check fail and print WHAT; a LINE the check must let pass has WHAT "-".
n=0
expect() {
  local mode=$1 file=$2 line=$3 what=$4 tree
  n=$((n + 1)); tree=$tmp/case$n
  cp -r "$clean" "$tree"
  printf '%s\n' "$line" >>"$tree/$file"
  if [ "$what" = - ]; then
    run "$mode" "$tree" || fail "$file + '$line': the $mode check fails"
  elif run "$mode" "$tree"; then
    fail "$file + '$line': the $mode check passes"
  elif ! grep -qF -- "$what" "$tmp/out"; then
    fail "$file + '$line': the $mode check does not name $what"
  fi
}

# names: stale in a doc
expect names docs/GUIDE.md 'Calls `stale_helper()` first.' stale_helper
expect names docs/GUIDE.md 'Holds a `StaleRing`.' StaleRing
expect names docs/GUIDE.md 'Uses `STALE_FRAGS`.' STALE_FRAGS
expect names docs/GUIDE.md 'Read `common/gone.h`.' common/gone.h
expect names docs/GUIDE.md 'Read `gone.cu`.' gone.cu
expect names docs/GUIDE.md 'Run `bash tests/gone.sh --fast`.' tests/gone.sh
expect names docs/GUIDE.md 'See [gone](GONE.md).' docs/GONE.md
expect names docs/GUIDE.md 'Reads `RealThing.stale_field`.' stale_field
expect names README.md 'Uses `thing_count()` and `stale_count()`.' stale_count
# names: a name that only a comment uses is stale too
expect names common/thing.c '// counts with stale_counter() (common/thing.h)' stale_counter
expect names common/thing.c '// keeps the parts in a PartRing' PartRing
expect names common/thing.c '/* see common/gone.c */' common/gone.c
expect names common/thing.c '// see `comment_only`: it is only in comments' comment_only
expect names tests/run.sh '# then tests/gone.sh' tests/gone.sh
# names: what is no stale name
expect names docs/GUIDE.md 'Runs `bash tests/run.sh` with `OMP_NUM_THREADS=1` and `--set data.seq_len=64`.' -
expect names common/thing.c '// the PyTorch way: thing_count() as count(x_i)' -
# history
expect history docs/GUIDE.md 'This came with issue 12.' 'issue 12'
expect history docs/GUIDE.md '## The fourth session' 'session'
expect history docs/GUIDE.md '## Measured (2026-12-01)' '2026-12-01'
expect history docs/GUIDE.md 'Run (2026-12-01, 22:00 UTC-).' '22:00 UTC'
expect history docs/GUIDE.md 'As measured by the lead.' 'the lead'
expect history docs/GUIDE.md 'Slower than in the earlier call.' 'earlier call'
expect history README.md 'Fixed in Issue #3.' 'Issue #3'
expect history common/thing.c '// counted once (issue 14 item 2)' 'issue 14'
expect history tests/run.sh '# as this session measured' 'this session'
expect history CHANGELOG.md '- the thing of issue 9' 'issue 9'
expect history CHANGELOG.md '## 2026-12-02, 09:00 UTC' -
expect history docs/GUIDE.md 'The parts lead the count; the producer issues 2 loads a step.' -

[ $failures -eq 0 ] && echo "check_docs.sh: the clean tree passes, all $n planted cases go the right way"
[ $failures -eq 0 ]
