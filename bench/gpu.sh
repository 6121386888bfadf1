#!/usr/bin/env bash
# Run ON a GPU machine, from the repository root (the device tool runs
# commands there): builds kiln against that machine's own PyTorch, runs the
# `gpu` tests, and benchmarks kiln against bench_gpu_hand_loop on the CNN in
# 32 and bf16-mixed (shared/bench-definition.md, "GPU"), alternating, medians.
# The machine has PyTorch with CUDA, CMake and nvcc but no Debian -dev
# packages and no network: bench/gpu_pack_debs.sh, run beforehand on the
# development machine, leaves them in shared/debs/, which the device tool
# carries. Results (versions, commands, numbers) go to $OUT, else bench/gpu-results/.
#   bench/gpu.sh [ROUNDS] [DEBS_DIR]      (default 3, shared/debs)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
rounds=${1:-3}
debs=${2:-shared/debs}
out=${OUT:-bench/gpu-results}
mkdir -p "$out"
log="$out/gpu.log"
say() { echo "$*" | tee -a "$log"; }
: >"$log"

# --- the Debian packages, unpacked into a prefix (dpkg -x, or ar + tar) ------
prefix=$PWD/build-gpu-deps
mkdir -p "$prefix"
for deb in "$debs"/*.deb; do
  [ -e "$deb" ] || { say "gpu.sh: no .deb files in $debs (run bench/gpu_pack_debs.sh first)"; exit 2; }
  if command -v dpkg >/dev/null; then
    dpkg -x "$deb" "$prefix"
  else
    (tmp=$(mktemp -d) && cd "$tmp" && ar x "$OLDPWD/$deb" && tar -xf data.tar.* -C "$prefix" && rm -rf "$tmp")
  fi
done
usr=$prefix/usr
arch_lib=$(ls -d "$usr"/lib/*-linux-gnu 2>/dev/null | head -1)
# Header-only libraries (toml++, Boost.DLL, Gloo, DLPack, xxhash) are found
# by the compiler through CPATH; the few shared ones through LIBRARY_PATH at
# link time and LD_LIBRARY_PATH when the tests run.
export CPATH="$usr/include${CPATH:+:$CPATH}"
export LIBRARY_PATH="$arch_lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$arch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
data=$usr/share/datasets/fashion-mnist

# --- build against this machine's PyTorch ----------------------------------
python=$(command -v python3 || command -v python)
torch_root=$("$python" -c "import os, torch; print(os.path.dirname(torch.__file__))")
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
{
  say "== machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version(), 'devices', torch.cuda.device_count())"
  nvcc --version | tail -2
  nproc
} 2>&1 | tee -a "$log"
build="build-gpu"
say "== build: cmake -S . -B $build -DCMAKE_PREFIX_PATH=\"$torch_root;$usr\""
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_root;$usr" >>"$log" 2>&1 &&
  cmake --build "$build" -j"$(nproc)" >>"$log" 2>&1 || { say "gpu.sh: the build failed; see $log"; tail -30 "$log"; exit 1; }

# --- the gpu tests ----------------------------------------------------------
say "== ctest -L gpu"
ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee -a "$log" | tail -15
[ "${KILN_GPU_FULL_SUITE:-0}" = 1 ] && { say "== whole suite"; ctest --test-dir "$build" -j"$(nproc)" 2>&1 | tail -15 | tee -a "$log"; }

# --- the benchmark: kiln versus the hand loop, alternating ------------------
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
say "== benchmark: CNN, batch 256, Adam 1e-3, 3 epochs, $rounds rounds per side"
for precision in 32 bf16-mixed; do
  : >"$out/hand.$precision"; : >"$out/kiln.$precision"
  for r in $(seq 1 "$rounds"); do
    "$build/bin/bench_gpu_hand_loop" "$precision" "$data" >"$out/hand.log" 2>&1
    grep '^epoch [0-9] seconds' "$out/hand.log" | awk '{print $4}' >>"$out/hand.$precision"
    rm -rf "$out/run"
    "$build/bin/kiln" fit bench/gpu_cnn.toml --set trainer.precision="$precision" --set data.root="$data" \
      --set run.dir="$out/run" --set run.log_level=debug >"$out/kiln.log" 2>&1 </dev/null
    awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="epoch_seconds") c=i; next} c && $c!="" {print $c}' \
      "$out/run/metrics.csv" >>"$out/kiln.$precision"
    if [ "$r" = 1 ]; then
      say "-- $precision: like-for-like markers (hand | kiln)"
      grep -E 'initial parameter sum|order starts|last batch loss|test accuracy' "$out/hand.log" | sed 's/^/  hand: /' | tee -a "$log"
      grep -E 'order starts|device cuda|test:' "$out/kiln.log" | sed 's/^/  kiln: /' | tee -a "$log"
    fi
  done
  hand=$(median <"$out/hand.$precision")
  kiln=$(median <"$out/kiln.$precision")
  awk -v p="$precision" -v h="$hand" -v k="$kiln" -v n="$rounds" 'BEGIN {
    printf "%s: hand %.3f s/epoch, kiln %.3f s/epoch (medians of %d epochs), kiln/hand = %.3f (target <= 1.03)\n",
           p, h, k, 3*n, k/h }' | tee -a "$log"
done
say "== done: $log"
