#!/usr/bin/env bash
# The stage order of #include "folder/..." lines, with no exceptions:
#   common  <- data, attention  <- model  <- dist  <- trainer  <- cli
# A folder includes its own headers and those of the folders it may use; dist/ (data
# parallel: launcher environment, rendezvous, communicators) uses common/ alone; tests/
# and bench/ may include every library folder (never cli/). Prints each violation as
# file:line: and exits 1 when there is one.
set -u
cd "$(dirname "$0")/.."
declare -A allowed=(
  [common]="common"
  [data]="common data"
  [attention]="common attention"
  [model]="common attention model"
  [dist]="common dist"
  [trainer]="common data attention model dist trainer"
  [cli]="common data attention model dist trainer cli"
  [tests]="common data attention model dist trainer tests"
  [bench]="common data attention model dist trainer tests bench"
)
status=0
for folder in "${!allowed[@]}"; do
  [ -d "$folder" ] || continue
  while IFS=: read -r file line text; do
    target=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"/]+)\/.*/\1/' <<<"$text")
    [[ "$target" == "$text" ]] && continue  # a same-folder include ("x.h") or <system>
    if [[ " ${allowed[$folder]} " != *" $target "* ]]; then
      echo "$file:$line: $folder/ may not include $target/ ($text)"
      status=1
    fi
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$folder" \
             --include='*.c' --include='*.cc' --include='*.h' --include='*.cu' --include='*.cuh')
done
# Source files in a folder the order does not name would escape the check.
while read -r file; do
  folder=${file%%/*}
  [[ "$file" == */* && -n "${allowed[$folder]+x}" ]] && continue
  echo "$file: in no stage folder of the order (tests/check_includes.sh)"
  status=1
done < <(git ls-files '*.c' '*.cc' '*.h' '*.cu' '*.cuh')
[ $status -eq 0 ] && echo "include directions: ok"
exit $status
