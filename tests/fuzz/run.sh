#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into build-fuzz/ and runs each for
# SECONDS (default 30) on a copy of its seed corpus. Exits non-zero on any
# finding (the crashing input is kept in build-fuzz/findings/). Idempotent.
#   tests/fuzz/run.sh [SECONDS] [TARGET...]     (targets: manifest checkpoint idx dlpack elf arrays csv image; default all)
# KILN_FUZZ_BUILD_DIR names another build directory (default build-fuzz).
# KILN_FUZZ_TORCH_PREFIX: a LibTorch 2.x root (the torch wheel's, as ./go
# --torch wheel installs it), built in build-fuzz-torch2, for the target that
# needs it:
#   KILN_FUZZ_TORCH_PREFIX=$PWD/.venv-torch/lib/python3.11/site-packages/torch tests/fuzz/run.sh 60 pt2
# Everything runs under `nice -n 10`: the machine stays usable. Two targets
# run at a time (each fuzzer is one process on one core).
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_EACH=${1:-30}
shift $(( $# > 0 ? 1 : 0 ))
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(manifest checkpoint idx dlpack elf arrays csv image)
BUILD=${KILN_FUZZ_BUILD_DIR:-build-fuzz}
torch_prefix=()
if [ -n "${KILN_FUZZ_TORCH_PREFIX:-}" ]; then
  BUILD=${KILN_FUZZ_BUILD_DIR:-build-fuzz-torch2}
  torch_prefix=(-DCMAKE_PREFIX_PATH="$KILN_FUZZ_TORCH_PREFIX")
fi

missing=()
for p in clang libclang-rt-14-dev libtorch-dev libdlpack-dev libxxhash-dev zlib1g-dev libspdlog-dev libtomlplusplus-dev libjpeg62-turbo-dev libpng-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S tests/fuzz -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang "${launcher[@]}" "${torch_prefix[@]}" >/dev/null
nice -n 10 cmake --build "$BUILD" -j2 --target "${TARGETS[@]/%/_fuzz}"

mkdir -p "$BUILD/findings"
# One target's run; its exit status goes to $BUILD/<target>.status.
fuzz_one() {
  local target=$1 corpus="$BUILD/corpus/$1" log="$BUILD/$1.log" rc=0
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1 \
    nice -n 10 "$BUILD/${target}_fuzz" "$corpus" \
    -max_total_time="$SECONDS_EACH" -max_len=65536 -malloc_limit_mb=256 -rss_limit_mb=4096 \
    -timeout=20 -artifact_prefix="$BUILD/findings/$target-" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  echo "$rc" >"$BUILD/$target.status"
}
for target in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$target"
  mkdir -p "$corpus"
  # A copy: what the run adds stays in the build directory, never in the repository.
  cp -n tests/fuzz/corpus/$target/* "$corpus/" 2>/dev/null || true
  rm -f "$BUILD/$target.status"
  fuzz_one "$target" &
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n || true; done
done
wait
status=0
for target in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$target"
  log="$BUILD/$target.log"
  if [ "$(cat "$BUILD/$target.status" 2>/dev/null)" = 0 ]; then
    runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$log")
    echo "fuzz $target: ok, ${runs:-? runs}, $(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)," \
      "corpus $(ls "$corpus" | wc -l) files ($(du -sk "$corpus" | cut -f1) KiB), peak rss $(sed -n 's/^stat::peak_rss_mb: *//p' "$log") MB"
  else
    echo "fuzz $target: FINDING (see $log and $BUILD/findings/)" >&2
    tail -40 "$log" >&2
    status=1
  fi
done
exit $status
