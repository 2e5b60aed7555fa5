#!/usr/bin/env bash
# No include circle between modules. A module is a source path without its extension
# (trainer/step.h and trainer/step.c are the module trainer/step); module A uses module B
# when a file of A has #include "B.ext" (a same-folder "x.h" is folder/x). The graph
# spans every stage folder, tests/ and bench/. Prints each circle as a path
# "a -> b -> a" (with every module of its strongly connected set) and exits 1 when
# there is one.
set -u
cd "$(dirname "$0")/.."
folders="common data attention model dist trainer cli tests bench"

declare -A exists=() edges=()
files=()
for folder in $folders; do
  [ -d "$folder" ] || continue
  while read -r file; do
    files+=("$file")
    exists[${file%.*}]=1
  done < <(find "$folder" -type f \( -name '*.c' -o -name '*.cc' -o -name '*.h' -o -name '*.cu' \
                                    -o -name '*.cuh' \) | sort)
done
for file in "${files[@]}"; do
  from=${file%.*}
  dir=${file%/*}
  while read -r target; do
    [[ "$target" == */* ]] || target="$dir/$target"
    to=${target%.*}
    [[ -n "${exists[$to]+x}" && "$to" != "$from" ]] || continue
    [[ " ${edges[$from]-} " == *" $to "* ]] || edges[$from]="${edges[$from]-} $to"
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/p' "$file")
done

# Tarjan's strongly connected components; a component of more than one module is a circle.
declare -A index=() low=() on_stack=()
stack=()
next_index=0
components=()
strongconnect() {
  local v=$1 w
  index[$v]=$next_index
  low[$v]=$next_index
  next_index=$((next_index + 1))
  stack+=("$v")
  on_stack[$v]=1
  for w in ${edges[$v]-}; do
    if [[ -z "${index[$w]+x}" ]]; then
      strongconnect "$w"
      (( low[$w] < low[$v] )) && low[$v]=${low[$w]}
    elif [[ -n "${on_stack[$w]+x}" ]]; then
      (( index[$w] < low[$v] )) && low[$v]=${index[$w]}
    fi
  done
  if (( low[$v] == index[$v] )); then
    local members=() top
    while :; do
      top=${stack[-1]}
      unset 'stack[-1]'
      unset 'on_stack[$top]'
      members+=("$top")
      [[ "$top" == "$v" ]] && break
    done
    (( ${#members[@]} > 1 )) && components+=("${members[*]}")
  fi
  return 0
}
for v in $(printf '%s\n' "${!exists[@]}" | sort); do
  [[ -n "${index[$v]+x}" ]] || strongconnect "$v"
done

# The shortest circle through the component's first module (breadth-first, inside it).
circle_through() {
  local start=$1 members=" $2 " v w path
  local -A parent=()
  local queue=("$start")
  while (( ${#queue[@]} )); do
    v=${queue[0]}
    queue=("${queue[@]:1}")
    for w in ${edges[$v]-}; do
      [[ "$members" == *" $w "* ]] || continue
      if [[ "$w" == "$start" ]]; then
        path="$start"
        while [[ "$v" != "$start" ]]; do path="$v -> $path"; v=${parent[$v]}; done
        echo "$start -> $path"
        return
      fi
      [[ -n "${parent[$w]+x}" ]] && continue
      parent[$w]=$v
      queue+=("$w")
    done
  done
}

status=0
for component in "${components[@]}"; do
  sorted=$(tr ' ' '\n' <<<"$component" | sort | tr '\n' ' ')
  sorted=${sorted% }
  echo "include circle: $(circle_through "${sorted%% *}" "$sorted") (modules: $sorted)"
  status=1
done
[ $status -eq 0 ] && echo "module graph: no include circle (${#exists[@]} modules)"
exit $status
