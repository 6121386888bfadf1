#!/usr/bin/env bash
# Run ON a GPU machine, from the repository root: builds kiln against that
# machine's own PyTorch, runs the `gpu` tests, then benchmarks kiln against
# bench_gpu_hand_loop (shared/bench-definition.md, "GPU"; bench/README.md).
#
#   bench/gpu.sh [--debs DIR] [--rounds N] [--build DIR] [--python PY] [PHASE...]
#
# PHASE: deps (unpack the .debs), configure, build, test (ctest -L gpu),
# bench; default: all five in that order. `suite` (not in the default) builds
# everything and runs the whole test suite. Later phases need the earlier
# ones' output in the build directory (kept between device calls only while
# the machine stays warm).
#   --debs DIR    the .deb files from bench/gpu_pack_debs.sh (default shared/debs)
#   --rounds N    benchmark rounds per side and precision (default 3)
#   --build DIR   build directory (default build-gpu; git-ignored)
#   --python PY   the Python whose torch to build against (default python3)
# Results go to $OUT when set (the device tool's output folder; at most 8
# files come back, so there are 6), else to <build>/results: summary.txt
# (machine, versions, commands, markers, medians, kiln/hand), epochs.csv
# (every timed epoch), runs.log (round 1's output of both sides),
# build.log, ctest.log, nvidia-smi.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

debs=shared/debs rounds=3 build=build-gpu python=python3 phases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --debs) debs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    deps|configure|build|test|bench|suite) phases+=("$1"); shift ;;
    *) echo "usage: bench/gpu.sh [--debs DIR] [--rounds N] [--build DIR] [--python PY] [deps|configure|build|test|bench|suite ...]" >&2
       exit 2 ;;
  esac
done
[ ${#phases[@]} -gt 0 ] || phases=(deps configure build test bench)
wants() { local p; for p in "${phases[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

mkdir -p "$build"
build=$(realpath "$build")
out=${OUT:-$build/results}
mkdir -p "$out"
summary=$out/summary.txt
say() { echo "$*" | tee -a "$summary"; }
run_logged() {  # run_logged LOG CMD...: the command line into the summary, its output into LOG
  local log=$1; shift
  say "\$ $*"
  "$@" >>"$log" 2>&1
}
: >>"$summary"
say "== bench/gpu.sh ${phases[*]} ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), rounds $rounds)"

# --- the carried Debian packages, unpacked into a prefix ---------------------
prefix=$build/deps
usr=$prefix/usr
if wants deps; then
  shopt -s nullglob
  files=("$debs"/*.deb)
  shopt -u nullglob
  if [ ${#files[@]} -eq 0 ]; then
    say "gpu.sh: no .deb files in $debs: run bench/gpu_pack_debs.sh on the development machine first"
    exit 2
  fi
  rm -rf "$prefix" && mkdir -p "$prefix"
  for deb in "${files[@]}"; do
    if command -v dpkg >/dev/null; then
      dpkg -x "$deb" "$prefix" || { say "gpu.sh: dpkg -x $deb failed"; exit 2; }
    else  # a .deb is an ar archive holding data.tar.*
      tmp=$(mktemp -d) abs=$(realpath "$deb")
      (cd "$tmp" && ar x "$abs" && tar -xf data.tar.* -C "$prefix") ||
        { say "gpu.sh: could not unpack $deb (no dpkg; ar + tar failed)"; exit 2; }
      rm -rf "$tmp"
    fi
  done
  # Absolute links (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) would
  # point into this machine's /, where that file may not exist.
  find "$prefix" -type l -lname '/*' | while read -r link; do
    target=$(readlink "$link")
    [ -e "$prefix$target" ] && ln -sfn "$prefix$target" "$link"
  done
  say "unpacked ${#files[@]} packages from $debs into $prefix ($(du -sh "$prefix" | cut -f1))"
fi
arch_lib=$usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
# Headers without a CMake target of their own (toml++, Boost.DLL, Gloo,
# xxhash) are found as /usr/include would be: CPLUS_INCLUDE_PATH is searched
# after every -isystem directory, so LibTorch's own {fmt} still comes before
# the packaged one where CMake does not say otherwise (CPATH would not: it
# ranks as -I). Libraries: LIBRARY_PATH at link time; to run, the build
# tree's RPATH names $arch_lib (libspdlog.so.1.10, libfmt.so.9,
# libxxhash.so.0), and LD_LIBRARY_PATH does too, for kiln's processes only
# (not for this machine's Python or tools; the packaged libz.so.1 is never on it).
export CPLUS_INCLUDE_PATH=$usr/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}
export C_INCLUDE_PATH=$usr/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}
export LIBRARY_PATH=$arch_lib:$usr/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
kiln_env=(env "LD_LIBRARY_PATH=$arch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
data=${KILN_GPU_DATA:-$usr/share/datasets/fashion-mnist}
[ -e "$data/train-images-idx3-ubyte.gz" ] || data=/usr/share/datasets/fashion-mnist

# --- the machine --------------------------------------------------------------
torch_root=$("$python" -c "import os, torch; print(os.path.dirname(torch.__file__))" 2>/dev/null)
[ -n "$torch_root" ] || { say "gpu.sh: '$python' has no torch (use --python)"; exit 2; }
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
{
  echo "-- machine"
  echo "GPU, driver, memory: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  echo "CUDA (driver): $(sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' "$out/nvidia-smi.txt" | head -1)"
  "$python" -c "import torch; print('PyTorch/LibTorch', torch.__version__, '| CUDA', torch.version.cuda, '| cuDNN', torch.backends.cudnn.version(), '| devices', torch.cuda.device_count(), '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')" 2>&1
  echo "LibTorch root: $torch_root"
  echo "nvcc: $(nvcc --version 2>&1 | tail -1)"
  echo "c++: $(c++ --version 2>&1 | head -1)"
  echo "cmake: $(cmake --version 2>&1 | head -1)"
  echo "os: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"'), $(nproc) cores, kernel $(uname -r)"
  echo "kiln tree: $(git rev-parse --short HEAD 2>/dev/null || echo 'no git'), data $data"
} 2>&1 | tee -a "$summary"

# --- build against this machine's PyTorch ------------------------------------
if wants configure; then
  gen=()
  [ -f "$build/CMakeCache.txt" ] || { command -v ninja >/dev/null && gen=(-G Ninja); }
  # CMAKE_POLICY_VERSION_MINIMUM: CMake 4 refuses the packaged CMake files'
  # cmake_policy(VERSION 2.6...) otherwise; older CMakes ignore it.
  run_logged "$out/build.log" cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_PREFIX_PATH=$torch_root;$usr" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DKILN_BUILD_TESTS=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
    -DKILN_BUILD_BENCH=ON || { say "gpu.sh: configure failed:"; tail -30 "$out/build.log" | tee -a "$summary"; exit 1; }
  grep -E 'kiln: LibTorch|PyTorch: CUDA detected' "$out/build.log" | tee -a "$summary"
fi
if wants build; then
  start=$(date +%s)
  run_logged "$out/build.log" "${kiln_env[@]}" cmake --build "$build" -j"$(nproc)" --target kiln kiln_cnn kiln_fashion_mnist \
    kiln_mlp kiln_synthetic kiln_gpu_tests bench_gpu_hand_loop ||
    { say "gpu.sh: build failed:"; grep -E 'error|Error' "$out/build.log" | head -30 | tee -a "$summary"; exit 1; }
  say "built in $(( $(date +%s) - start )) s"
fi
tests_failed=0
if wants test; then
  run_logged "$out/ctest.log" "${kiln_env[@]}" ctest --test-dir "$build" -L gpu --output-on-failure --timeout 900 || tests_failed=1
  grep -E 'tests passed|tests failed|Skipped|\*\*\*|Failed|Passed' "$out/ctest.log" | tail -12 | tee -a "$summary"
fi
if wants suite; then
  export KILN_TEST_FASHION_MNIST=$data
  run_logged "$out/build.log" "${kiln_env[@]}" cmake --build "$build" -j"$(nproc)" || { say "gpu.sh: build of the suite failed"; exit 1; }
  # The char-LM accuracy test needs Debian's `bible` program (bible-kjv),
  # which a .deb cannot bring to this machine's distribution: it is left out
  # here, by name, and runs on the development machine and in CI.
  exclude=()
  command -v bible >/dev/null || { exclude=(-E 'accuracy\.CharLm'); say "suite: accuracy.CharLm left out (no 'bible' program from bible-kjv here)"; }
  run_logged "$out/ctest.log" "${kiln_env[@]}" ctest --test-dir "$build" -j"$(( $(nproc) * 3 / 4 ))" --timeout 300 --output-on-failure "${exclude[@]}" || tests_failed=1
  grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -2 | tee -a "$summary"
fi

# --- the benchmark: kiln versus the hand loop, alternating ----------------------
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2); else print ""}'; }
if wants bench; then
  hand=("$build/bin/bench_gpu_hand_loop")
  kiln=("$build/bin/kiln" fit bench/gpu_cnn.toml --set "data.root=$data")
  if [ ! -x "${hand[0]}" ] || [ ! -x "${kiln[0]}" ]; then say "gpu.sh: build first (phases configure build)"; exit 1; fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  epochs=$out/epochs.csv
  echo "side,precision,round,epoch,seconds" >"$epochs"
  : >"$out/runs.log"
  say "-- benchmark: CNN [32, 64] + 128, batch 256, Adam 1e-3, 3 epochs per run, $rounds rounds per side;" \
      "the side that goes first alternates by round"
  say "   hand: ${hand[*]} <precision> $data 1"
  say "   kiln: ${kiln[*]} --set trainer.precision=<precision> --set run.dir=<tmp>"
  run_hand() {  # run_hand PRECISION ROUND
    timeout 600 "${kiln_env[@]}" "${hand[@]}" "$1" "$data" 1 >"$tmp/hand.log" 2>&1 || echo "(exit $?)" >>"$tmp/hand.log"
    awk -v p="$1" -v r="$2" '/^epoch [0-9]+ seconds/ {print "hand," p "," r "," $2 "," $4}' "$tmp/hand.log" >>"$epochs"
    [ "$2" = 1 ] && { echo "=== hand $1, round 1"; cat "$tmp/hand.log"; } >>"$out/runs.log"
  }
  run_kiln() {  # run_kiln PRECISION ROUND
    rm -rf "$tmp/run"
    timeout 600 "${kiln_env[@]}" "${kiln[@]}" --set "trainer.precision=$1" --set "run.dir=$tmp/run" \
      >"$tmp/kiln.log" 2>&1 </dev/null || echo "(exit $?)" >>"$tmp/kiln.log"
    [ -f "$tmp/run/metrics.csv" ] && awk -F, -v p="$1" -v r="$2" '
      NR == 1 {for (i = 1; i <= NF; i++) {if ($i == "epoch_seconds") s = i; if ($i == "epoch") e = i}; next}
      s && $s != "" {print "kiln," p "," r "," $e "," $s}' "$tmp/run/metrics.csv" >>"$epochs"
    [ "$2" = 1 ] && { echo "=== kiln $1, round 1"; cat "$tmp/kiln.log"; } >>"$out/runs.log"
  }
  for precision in 32 bf16-mixed; do
    for r in $(seq 1 "$rounds"); do
      if [ $((r % 2)) = 1 ]; then run_hand "$precision" "$r"; run_kiln "$precision" "$r"
      else run_kiln "$precision" "$r"; run_hand "$precision" "$r"; fi
      if [ "$r" = 1 ]; then
        say "-- $precision: like-for-like markers (round 1)"
        grep -E 'initial parameter sum|order starts|last batch loss|test accuracy|no CUDA|exit [0-9]' "$tmp/hand.log" |
          sed 's/^/  hand: /' | tee -a "$summary"
        grep -E 'device cuda|initial parameter sum|order starts|epoch 2 batch|info test:|error|exit [0-9]' "$tmp/kiln.log" |
          sed -E 's/^\[[0-9:]+\] //; s/^/  kiln: /' | tee -a "$summary"
      fi
    done
    for side in hand kiln; do
      awk -F, -v s="$side" -v p="$precision" '$1 == s && $2 == p {print $5}' "$epochs" | median >"$tmp/$side.all"
      awk -F, -v s="$side" -v p="$precision" '$1 == s && $2 == p && $4 >= 1 {print $5}' "$epochs" | median >"$tmp/$side.warm"
    done
    n=$(awk -F, -v p="$precision" '$1 == "kiln" && $2 == p' "$epochs" | wc -l)
    awk -v p="$precision" -v ha="$(cat "$tmp/hand.all")" -v ka="$(cat "$tmp/kiln.all")" \
        -v hw="$(cat "$tmp/hand.warm")" -v kw="$(cat "$tmp/kiln.warm")" -v n="$n" 'BEGIN {
      ok = (ha != "" && ka != "" && ha + 0 > 0 && ka + 0 > 0)
      printf "%s: hand %s s/epoch, kiln %s s/epoch (medians of all epochs, %d kiln epochs), kiln/hand = %s (target <= 1.03%s)\n",
             p, ha == "" ? "n/a" : sprintf("%.4f", ha), ka == "" ? "n/a" : sprintf("%.4f", ka), n,
             ok ? sprintf("%.3f", ka / ha) : "n/a", ok ? (ka / ha <= 1.03 ? ": met" : ": missed") : ""
      if (hw != "" && kw != "" && hw + 0 > 0 && kw + 0 > 0)
        printf "%s, epochs 1-2 only (kiln has no warm-up of its own): hand %.4f, kiln %.4f, kiln/hand = %.3f\n",
               p, hw, kw, kw / hw
    }' | tee -a "$summary"
  done
fi
say "== done; results in $out"
exit "$tests_failed"
