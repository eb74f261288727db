#!/bin/sh
# The shared library exports what its installed headers declare, and
# nothing else: internals have their own prefixes and stay hidden.
#   exports.sh LIBTERN.so INCLUDE_DIR
set -eu
lib=$1
inc=$2
declared=$(mktemp)
exported=$(mktemp)
trap 'rm -f "$declared" "$exported"' EXIT
# Every function a public header declares: a tern_ name followed by '('.
cat "$inc"/*.h | grep -oE '\btern_[a-z0-9_]+[[:space:]]*\(' | tr -d '( \t' | sort -u >"$declared"
nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRW]$/ {print $3}' | sed 's/@.*//' | sort -u >"$exported"
extra=$(comm -23 "$exported" "$declared")
if [ -n "$extra" ]; then
    echo "exported but declared in no installed header:"
    echo "$extra" | sed 's/^/  /'
    exit 1
fi
missing=$(comm -13 "$exported" "$declared")
if [ -n "$missing" ]; then
    echo "declared in an installed header but not exported:"
    echo "$missing" | sed 's/^/  /'
    exit 1
fi
echo "exports: $(wc -l <"$exported") symbols, each declared in an installed header"
