#!/usr/bin/env bash
# Writes the seeds of elf_fuzz (corpus/elf/): real kiln plugins from a build,
# whole and cut at many lengths (an interrupted copy), as the loader would
# meet them. The small C stub plugin whole and cut; the MLP plugin (LibTorch,
# ~240 KB, over the fuzzer's 64 KiB inputs) only cut. Rewrites only its own
# files.   tests/fuzz/make_elf_seeds.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
out=tests/fuzz/corpus/elf
stub=$BUILD/test-plugins/libkiln_stub_ok.so
mlp=$BUILD/lib/kiln/plugins/libkiln_mlp.so
for f in "$stub" "$mlp"; do
  [ -f "$f" ] || { echo "make_elf_seeds: $f is missing; build it first (./go build)" >&2; exit 2; }
done
mkdir -p "$out"
rm -f "$out"/stub_* "$out"/mlp_*
size=$(stat -c %s "$stub")
cp "$stub" "$out/stub_whole.so"
for n in 0 3 63 64 120 600 4096 $((size / 2)) $((size - 1)); do
  head -c "$n" "$stub" >"$out/stub_cut_$n.so"
done
for n in 64 4096 16384; do
  head -c "$n" "$mlp" >"$out/mlp_cut_$n.so"
done
ls -l "$out"
