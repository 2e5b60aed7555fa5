#!/usr/bin/env bash
# Docs and source comments say what is true now. Two checks over the docs (docs/*.md,
# README.md and every folder's README.md, CHANGELOG.md) and the comments of the sources
# (*.c *.h *.cu *.cuh *.cc *.sh of the stage folders, tests/, bench/, scripts/):
#   names    A name the docs write in backticks or link to, or a comment uses, exists:
#            - a path (a '/' under a folder of the tree, .. or a hidden folder; or a bare
#              name ending in .c .h .cu .cuh .cc .sh .py .md .json .jinja) is a tracked
#              file or folder or a path suffix of one, a path the tree ignores (build/,
#              runs/), or a string of the code ("run_config.json", "dir/config.json");
#            - an identifier (name(), lower case with an underscore, camel case with two
#              humps, A::b, Type.member) is a word of the code of a tracked file,
#              comments left out, or a tracked file's name (a test, a program).
#            Not names: globs and placeholders (* ? { < ... N DIR FILE), text with spaces
#            but for the repository paths in it, dotted keys (train.lr, model.layers.N),
#            the subscripts of the maths (p_t, x_i), vendor names (__x, cudaX, cuX,
#            ncclX, sm_90), names qualified by another project (torch.x, flash::X,
#            hopper/x.hpp) and, in comments, camel-case words the docs use as plain
#            words (product names: the docs write code in backticks).
#   history  No work-history vocabulary (the list below).
# Usage: tests/check_docs.sh [names|history|all] [ROOT]. ROOT defaults to this
# repository; one that is not a git work tree is read with find (the fake trees of
# tests/check_docs_selftest.sh). Prints each finding as file:line: and exits 1 when
# there is one.
set -u
mode=${1:-all}
root=${2:-"$(dirname "$0")/.."}
cd "$root" || exit 2
case $mode in names|history|all) ;; *) echo "usage: $0 [names|history|all] [ROOT]" >&2; exit 2;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files >"$tmp/files"
else
  find . -type f ! -path './.git/*' | sed 's|^\./||' | LC_ALL=C sort >"$tmp/files"
fi
grep -E '^(docs/[^/]*\.md|CHANGELOG\.md|(.*/)?README\.md)$' "$tmp/files" >"$tmp/docs"
# Source files whose comments are checked.
grep -E '^(common|data|attention|model|dist|trainer|cli|tests|bench|scripts)/.*\.(c|h|cu|cuh|cc|sh)$' \
  "$tmp/files" >"$tmp/sources"
# Files whose code (comments left out) defines what exists; the self-test's fake tree
# names nothing of this one.
grep -E '\.(c|h|cu|cuh|cc|sh|py|cmake|jinja)$|(^|/)CMakeLists\.txt$|^configs/.*\.json$|^\.ci/' \
  "$tmp/files" | grep -vx 'tests/check_docs_selftest\.sh' >"$tmp/code_files"

# Splits each code file into its code (to code.txt) and its comments (file:line:text to
# comments.txt, for the files named in sources). C-like files: // and /* */ outside
# strings and character literals; others: # at a line's start or after a blank, outside
# quotes. Strings stay code: they name files, keys and formats.
split_code() {
  awk -v sources="$tmp/sources" -v code="$tmp/code.txt" -v comments="$tmp/comments.txt" '
    BEGIN { while ((getline f < sources) > 0) checked[f] = 1 }
    FNR == 1 { cstyle = FILENAME ~ /\.(c|h|cu|cuh|cc)$/; inblock = 0 }
    function note(text) { if ((FILENAME in checked) && text ~ /[^[:space:]]/) print FILENAME ":" FNR ":" text > comments }
    {
      rest = $0; out = ""; com = ""
      while (rest != "") {
        if (inblock) {
          e = index(rest, "*/")
          if (e == 0) { com = com rest; rest = ""; break }
          com = com substr(rest, 1, e - 1) " "; rest = substr(rest, e + 2); inblock = 0; continue
        }
        if (cstyle) p = match(rest, /"|\047|\/\*|\/\//)
        else p = match(rest, /"|\047|(^|[[:space:]])#/)
        if (p == 0) { out = out rest; break }
        tok = substr(rest, RSTART, RLENGTH)
        out = out substr(rest, 1, RSTART - 1)
        rest = substr(rest, RSTART + RLENGTH)
        if (tok == "\"" || tok == "\047") {
          if (!cstyle && tok == "\047") re = "^[^\047]*\047"
          else if (tok == "\"") re = "^([^\"\\\\]|\\\\.)*\""
          else re = "^([^\047\\\\]|\\\\.)*\047"
          if (match(rest, re)) { out = out tok substr(rest, 1, RLENGTH); rest = substr(rest, RLENGTH + 1) }
          else { out = out tok rest; rest = "" }
        } else if (tok == "/*") {
          inblock = 1
        } else {
          com = com rest; rest = ""
        }
      }
      print out > code
      note(com)
    }' "$@"
}

# Every name a doc or a comment uses, one per line: file:line TAB kind TAB text, where
# kind is span (a backticked span), word (a word of a fenced block or of a comment) or
# link (a markdown link's target, relative to the doc).
collect_names() {
  awk -v camel="$camel" '
    FNR == 1 { fenced = 0; carry = "" }
    function spans(loc, text, kind,    n, run, e, inner) {
      out = ""
      while ((n = match(text, /`+/)) > 0) {
        run = substr(text, RSTART, RLENGTH)
        out = out substr(text, 1, RSTART - 1) " "
        text = substr(text, RSTART + RLENGTH)
        e = index(text, run)
        if (e == 0) return run text   # open at the line end: carried on
        inner = substr(text, 1, e - 1)
        print loc "\tspan\t" inner
        text = substr(text, e + length(run))
      }
      out = out text
      return ""
    }
    function words(loc, text, kind,    n, i, w) {
      n = split(text, w, /[[:space:]]+/)
      for (i = 1; i <= n; i++) if (w[i] != "") print loc "\t" kind "\t" w[i]
    }
    FILENAME ~ /\.md$/ {
      loc = FILENAME ":" FNR
      if ($0 ~ /^[[:space:]]*(```|~~~)/) { fenced = !fenced; next }
      if (fenced) { words(loc, $0, "word"); next }
      if (carry != "") { text = carry " " $0; loc = carryloc } else text = $0
      carry = spans(loc, text)
      if (carry != "") carryloc = loc
      rest = out
      n = split(out, w, /[^A-Za-z0-9_]+/)
      for (i = 1; i <= n; i++) if (w[i] ~ camel) print loc "\tprose\t" w[i]
      while (match(rest, /\]\([^) ]+\)/)) {
        print loc "\tlink\t" substr(rest, RSTART + 2, RLENGTH - 3)
        rest = substr(rest, RSTART + RLENGTH)
      }
      next
    }
    {  # comments.txt: file:line:text
      match($0, /^[^:]*:[0-9]+:/)
      loc = substr($0, 1, RLENGTH - 1); text = substr($0, RLENGTH + 1)
      spans(loc, text)
      words(loc, out, "cword")
    }' "$@"
}

# Turns collected names into checks: "path<TAB>loc<TAB>text<TAB>path" and
# "ident<TAB>loc<TAB>text<TAB>identifier", one a line.
classify() {
  awk -F '\t' -v files="$tmp/files" -v camel="$camel" '
    BEGIN {
      while ((getline f < files) > 0) if (split(f, p, "/") > 1) top[p[1]] = 1
      top[".."] = 1
      ext = "\\.(c|h|cu|cuh|cc|sh|py|md|json|jinja)$"
    }
    function placeholder(w,    n, s, i) {
      if (w ~ /[*?{}<>\[\]$]|\.\.\.|…|\\/) return 1
      n = split(w, s, /[\/._-]+/)
      for (i = 1; i <= n; i++)
        if (s[i] ~ /^(N+|X|DIR|FILE|PATH|PREFIX|NAME|TREE|OUT|SHAPE|[A-Z])$/) return 1
      return 0
    }
    # A path into this tree: relative, under a folder of the tree, .. or a hidden folder
    # (a file of another project is written under its own folder: hopper/x.hpp).
    function repo_path(w,    first) {
      if (w ~ /^(\/|~|-|[a-z]+:)/ || w !~ /\// || placeholder(w)) return 0
      first = w; sub(/^\.\//, "", first); sub(/\/.*/, "", first)
      return (first in top) || first ~ /^\./
    }
    # Vendor namespaces: compiler intrinsics, the CUDA runtime and driver, NCCL, cuDNN,
    # cuBLAS, GPU architectures.
    function vendor(n) { return n ~ /^(__|(cuda|cu|nccl|cudnn|cublas)[A-Z]|sm_[0-9])/ }
    function candidate(n, called) {
      if (n !~ /^[A-Za-z_][A-Za-z0-9_]*$/ || vendor(n) || n ~ /^_|_$/) return 0
      if (called) return 1
      if (n ~ /^[A-Za-z]+_[A-Za-z0-9]$/) return 0  # a subscript of the maths: p_t, x_i, sum_j
      return n ~ /_/ || n ~ camel
    }
    function ident(n, called) { if (candidate(n, called)) print "ident\t" loc "\t" text "\t" n }
    function path(w) { print "path\t" loc "\t" text "\t" w }
    function qualified(t, sep,    n, q, i) {  # A::b or A.b: checked only when A is a name
      n = split(t, q, sep)
      if (!candidate(q[1], 0) || (sep == "[.]" && q[1] !~ /^[A-Z]/)) return
      for (i = 1; i <= n; i++) ident(q[i], 0)
    }
    function link(t, dir,    n, s, i, out, k) {
      if (t ~ /^([a-z]+:|#)/) return
      sub(/#.*/, "", t)
      n = split(dir "/" t, s, "/"); k = 0
      for (i = 1; i <= n; i++) {
        if (s[i] == "" || s[i] == ".") continue
        if (s[i] == ".." && k > 0) { k--; continue }
        out[++k] = s[i]
      }
      t = ""
      for (i = 1; i <= k; i++) t = t (i > 1 ? "/" : "") out[i]
      path(t)
    }
    {
      loc = $1; kind = $2; text = $3
      t = text; gsub(/^[[:space:]]+|[[:space:]]+$/, "", t)
      if (t == "") next
      if (kind == "prose") { proper[t] = 1; next }
      if (kind == "link") { dir = loc; sub(/\/?[^\/]*$/, "", dir); link(t, dir); next }
      if (kind == "cword") {  # prose around it: only clear names count
        gsub(/^[("\047]+|[)"\047,;:.!?]+$/, "", t); sub(/\047s$/, "", t)
        if (repo_path(t) || (t ~ ext && t ~ /^[A-Za-z0-9_.-]+$/ && !placeholder(t))) path(t)
        else if (match(t, /^[A-Za-z_][A-Za-z0-9_]*\(\)?$/) && t ~ /_/) ident(substr(t, 1, index(t, "(") - 1), 1)
        else if (t ~ /^[a-z][a-z0-9]*(_[a-z0-9]+)+$/) ident(t, 0)
        else if (t ~ camel && !(t in proper)) ident(t, 0)  # not a name the docs use as a word
        next
      }
      if (kind == "word") { gsub(/^["\047(]+|["\047),;:]+$/, "", t); if (repo_path(t)) path(t); next }
      # a backticked span
      if (match(t, /^[A-Za-z_][A-Za-z0-9_]*((<[^>]*>)|(\[[^]]*\])|(\([^)]*\)))+;?$/)) {
        n = t; sub(/[<[(].*/, "", n)
        ident(n, substr(t, length(n) + 1, 1) == "(")
        next
      }
      if (t ~ /[[:space:]]/) {
        c = split(t, w, /[[:space:]]+/)
        for (i = 1; i <= c; i++) { gsub(/^["\047(]+|["\047),;:]+$/, "", w[i]); if (repo_path(w[i])) path(w[i]) }
        next
      }
      if (t ~ /\/\/|^[a-z]+:/) next  # a URL
      if (t ~ /\// || t ~ ext) {
        sub(/:[0-9]*:?$/, "", t)
        if (t ~ /\// ? repo_path(t) : !placeholder(t)) path(t)
        next
      }
      if (index(t, "::")) { qualified(t, "::"); next }
      if (index(t, ".")) { qualified(t, "[.]"); next }
      ident(t, 0)
    }'
}

# Camel case with two humps, each a capital and a small letter (so not KiB, SwiGLU, F2FP).
camel='^[A-Z][a-z][A-Za-z0-9]*[A-Z][a-z][A-Za-z0-9]*$'

check_names() {
  local -a docs
  mapfile -t docs <"$tmp/docs"
  collect_names "${docs[@]}" "$tmp/comments.txt" | classify >"$tmp/checks"
  # identifiers that are no word of the code
  awk -F '\t' '$1 == "ident" { print $4 }' "$tmp/checks" | LC_ALL=C sort -u >"$tmp/idents"
  : >"$tmp/found"
  [ -s "$tmp/idents" ] && grep -owF -f "$tmp/idents" "$tmp/code.txt" | LC_ALL=C sort -u >"$tmp/found"
  sed -E 's|.*/||; s|\..*||' "$tmp/files" >>"$tmp/found"  # a test's or a program's name
  LC_ALL=C sort -u -o "$tmp/found" "$tmp/found"
  LC_ALL=C comm -23 "$tmp/idents" "$tmp/found" >"$tmp/missing"
  # paths that are no tracked file or folder, nor a path suffix of one
  awk -F '\t' '$1 == "path" { print $4 }' "$tmp/checks" | LC_ALL=C sort -u |
    awk -v files="$tmp/files" '
      BEGIN {
        while ((getline f < files) > 0) {
          n = split(f, s, "/")
          for (i = 1; i <= n; i++) {          # every suffix of every prefix
            p = s[i]; known[p] = 1
            for (j = i + 1; j <= n; j++) { p = p "/" s[j]; known[p] = 1 }
          }
        }
      }
      { p = $0; sub(/^\.\//, "", p); sub(/\/+$/, "", p); if (!(p in known)) print }' |
    while IFS= read -r p; do
      if git check-ignore -q --no-index "$p" 2>/dev/null; then continue; fi  # an output
      grep -qF -- "$p" "$tmp/code.txt" && continue                            # a name the code writes
      echo "$p"
    done >>"$tmp/missing"
  awk -F '\t' -v missing="$tmp/missing" '
    BEGIN { while ((getline m < missing) > 0) gone[m] = 1 }
    ($1 == "ident" || $1 == "path") && ($4 in gone) {
      what = $1 == "path" ? "no file or folder" : "no function, type or name in the code"
      print $2 ": " what " `" $4 "`" ($3 != $4 ? " (in `" $3 "`)" : ""); bad = 1
    }
    END { exit bad }' "$tmp/checks"
}

# Work-history vocabulary, short on purpose: what happened when lives in git and
# CHANGELOG.md; docs and comments say what is.
history_words='\b([Ii]ssue|PR|[Pp]ull request) #?[0-9]+|\b[Ii]ssues #[0-9]+|\b[Ss]essions?\b|\b[Tt]he lead\b|\b([Tt]he|[Aa]n) earlier calls?\b'
# Dated chapters and time stamps (CHANGELOG.md is the history: it may date its entries).
history_dates='^#+ .*[0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{1,2}:[0-9]{2}( ?[-–] ?[0-9]{1,2}:[0-9]{2})? UTC'

check_history() {
  local -a docs
  mapfile -t docs <"$tmp/docs"
  [ ${#docs[@]} -gt 0 ] && awk '{ print FILENAME ":" FNR ":" $0 }' "${docs[@]}" >"$tmp/history.txt"
  cat "$tmp/comments.txt" >>"$tmp/history.txt"
  awk -v words="$tmp/hit_words" -v dates="$tmp/hit_dates" '
    { match($0, /^[^:]*:[0-9]+:/); loc = substr($0, 1, RLENGTH - 1); text = substr($0, RLENGTH + 1)
      print text > words
      print (loc ~ /^CHANGELOG\.md:/ ? "" : text) > dates
      print loc > (words ".loc") }' "$tmp/history.txt"
  { grep -nE -- "$history_words" "$tmp/hit_words"; grep -nE -- "$history_dates" "$tmp/hit_dates"; } |
    cut -d: -f1 | sort -nu |
    awk -v locs="$tmp/hit_words.loc" -v texts="$tmp/hit_words" '
      BEGIN { while ((getline l < locs) > 0) { n++; loc[n] = l; getline t < texts; text[n] = t } }
      { t = text[$1]; gsub(/^[[:space:]]+/, "", t)
        print loc[$1] ": work history: " substr(t, 1, 110) (length(t) > 110 ? "…" : ""); bad = 1 }
      END { exit bad }'
}

status=0
split_code_all() {
  local -a code_files
  mapfile -t code_files <"$tmp/code_files"
  : >"$tmp/code.txt"; : >"$tmp/comments.txt"
  [ ${#code_files[@]} -gt 0 ] && split_code "${code_files[@]}"
}
split_code_all
if [ "$mode" = names ] || [ "$mode" = all ]; then
  if check_names; then echo "names in docs and comments: ok"; else status=1; fi
fi
if [ "$mode" = history ] || [ "$mode" = all ]; then
  if check_history; then echo "work history in docs and comments: none"; else status=1; fi
fi
exit $status
