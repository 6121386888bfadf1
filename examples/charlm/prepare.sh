#!/bin/sh
# Writes the King James Bible as plain text: the token file of the charlm
# example (every byte is a token). The text comes from the Debian packages
# bible-kjv (the `bible` reader, GPL) and bible-kjv-text (the text, public
# domain). 4,298,239 bytes of ASCII, the same on every machine: -l80 fixes
# the line width, which otherwise follows $COLUMNS.
#
#   examples/charlm/prepare.sh [OUT]     OUT defaults to kjv.txt beside this script
#
# Idempotent: an up-to-date OUT is left untouched (not even its mtime), and a
# new one appears whole or not at all (written aside, then renamed).
set -eu
out=${1:-$(dirname "$0")/kjv.txt}
if ! command -v bible >/dev/null 2>&1; then
  echo "prepare.sh: the 'bible' program is missing; install the Debian packages bible-kjv and bible-kjv-text" >&2
  exit 1
fi
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
bible -l80 Gen1:1-Rev22:21 > "$tmp"
if [ -f "$out" ] && cmp -s "$tmp" "$out"; then
  exit 0
fi
mv "$tmp" "$out"
echo "prepare.sh: wrote $out ($(wc -c < "$out") bytes)"
