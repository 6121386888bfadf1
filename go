#!/usr/bin/env bash
# One entry point for a fresh Debian bookworm machine. Idempotent.
#   ./go example   install what is missing, build, train the Fashion-MNIST MLP
#   ./go test      install what is missing, build, run the whole test suite
#   ./go build     install what is missing and build only
#   ./go test --sanitize   the same suite (unit + integration) built with ASan+UBSan, in build-asan/
#   ./go test --tsan       the concurrency tests built with ThreadSanitizer, in build-tsan/
#   ./go fuzz [SECONDS]    the libFuzzer targets, SECONDS each (default 30), in build-fuzz/
#   ./go build|test|example --torch wheel
#                          the same against LibTorch 2.x from PyPI's torch wheel (pinned below),
#                          installed into .venv-torch/, built in build-torch2/
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(
  cmake g++ make pkg-config
  libtorch-dev libgloo-dev libboost-dev libtomlplusplus-dev libspdlog-dev libcli11-dev
  libgtest-dev libdlpack-dev libxxhash-dev zlib1g-dev
  dataset-fashion-mnist
  # Without it LibTorch runs on Netlib's reference BLAS, ~19x slower on an MLP.
  libopenblas0-openmp
)
BUILD_DIR=${KILN_BUILD_DIR:-build}
# The LibTorch 2.x variant: PyPI's torch wheel carries a complete LibTorch
# (headers, libraries, CMake package). 2.11.0's wheel is built for CUDA 13.0,
# the toolkit this machine has, so its CUDA parts configure and compile here.
TORCH_WHEEL_VERSION=2.11.0
TORCH_VENV=.venv-torch
torch_args=()

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "go: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# ccache, when present, makes the variants' builds share compiled units.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

build() {
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "${torch_args[@]}" "$@" >/dev/null
  cmake --build "$BUILD_DIR" -j2
}

# Installs the pinned torch wheel into $TORCH_VENV if it is not there yet,
# and points the build at its LibTorch (build-torch2/ unless KILN_BUILD_DIR).
use_torch_wheel() {
  if ! "$TORCH_VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_WHEEL_VERSION')" 2>/dev/null; then
    echo "go: installing torch==$TORCH_WHEEL_VERSION into $TORCH_VENV (once; a few GB)"
    python3 -m venv "$TORCH_VENV"
    "$TORCH_VENV/bin/pip" install -q "torch==$TORCH_WHEEL_VERSION"
  fi
  local root
  root=$("$TORCH_VENV/bin/python" -c "import os, torch; print(os.path.dirname(torch.__file__))" 2>/dev/null)
  BUILD_DIR=${KILN_BUILD_DIR:-build-torch2}
  # The package (share/cmake) and the root itself: TorchConfig finds its
  # libraries through CMAKE_PREFIX_PATH before its own hint, and would
  # otherwise take Debian's /usr/lib/.../libtorch.so.
  torch_args=(-DCMAKE_PREFIX_PATH="$root/share/cmake;$root")
}

# Takes "--torch wheel" (or "--torch debian", the default) off the arguments.
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --torch)
      case "${2:-}" in
        wheel) use_torch_wheel_wanted=1 ;;
        debian) ;;
        *) echo "go: --torch takes 'wheel' or 'debian'" >&2; exit 2 ;;
      esac
      shift 2
      ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"

# Sanitizer runs: a finding in any process (kiln, a worker, a test) fails
# the test that started it. LibTorch and OpenMP are not instrumented; leak
# checking is off because LibTorch's process-lifetime registries would drown
# kiln's own leaks (ASan still reports use-after-free, overflows, UB).
export_sanitizer_options() {
  # handle_segv=0: the fault-injection tests send real SIGSEGVs and expect
  # the process to die of them, as it would without ASan.
  export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_odr_violation=0:handle_segv=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitizers/tsan.supp"
  # Timing bounds in tests are against hangs; instrumented code is slower.
  export KILN_TEST_TIMEOUT_SCALE=3
}

case "${1:-}" in
  example)
    install_missing
    [ -n "${use_torch_wheel_wanted:-}" ] && use_torch_wheel
    build
    "$BUILD_DIR/bin/kiln" fit examples/fashion_mnist/mlp.toml
    ;;
  test)
    install_missing
    [ -n "${use_torch_wheel_wanted:-}" ] && use_torch_wheel
    case "${2:-}" in
      --sanitize)
        BUILD_DIR=${KILN_BUILD_DIR:-build-asan}
        build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=address,undefined -DKILN_BUILD_BENCH=OFF
        export_sanitizer_options
        ctest --test-dir "$BUILD_DIR" --output-on-failure -j2 -R '^(unit|integration)\.'
        ;;
      --tsan)
        BUILD_DIR=${KILN_BUILD_DIR:-build-tsan}
        cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=thread \
          -DKILN_BUILD_BENCH=OFF "${launcher[@]}" >/dev/null
        cmake --build "$BUILD_DIR" -j2 --target kiln_unit_tests
        export_sanitizer_options
        ctest --test-dir "$BUILD_DIR" --output-on-failure -j2 \
          -R '^unit\.(Supervisor|Heartbeat|SignalWatcher|PrefetcherTest)\.'
        ;;
      "")
        build
        ctest --test-dir "$BUILD_DIR" --output-on-failure -j2
        ;;
      *)
        echo "usage: ./go test [--sanitize | --tsan]" >&2
        exit 2
        ;;
    esac
    ;;
  fuzz)
    install_missing
    tests/fuzz/run.sh "${2:-30}"
    ;;
  build)
    install_missing
    [ -n "${use_torch_wheel_wanted:-}" ] && use_torch_wheel
    build
    ;;
  *)
    echo "usage: ./go example | test [--sanitize | --tsan] | build | fuzz [SECONDS]  [--torch wheel]" >&2
    exit 2
    ;;
esac
