#!/usr/bin/env bash
# One entry point for a fresh Debian bookworm machine. Idempotent.
#   ./go example   install what is missing, build kiln and its shipped plugins, train the Fashion-MNIST MLP
#   ./go test      install what is missing, build, run the whole test suite
#   ./go build     install what is missing and build only
#   ./go test --sanitize   the same suite (unit + integration) built with ASan+UBSan, in build-asan/
#                          (the plugins are build/'s, uninstrumented: built there first if missing)
#   ./go test --tsan       the concurrency tests built with ThreadSanitizer, in build-tsan/
#   ./go fuzz [SECONDS]    the libFuzzer targets, SECONDS each (default 30), in build-fuzz/
#   ./go fuzz --torch wheel [SECONDS]
#                          the target that needs LibTorch 2.x (pt2), in build-fuzz-torch2/
#   ./go test|build|example --torch wheel
#                          the same against LibTorch 2.x from PyPI's torch wheel
#                          (pinned below, in .venv-torch/), built in build-torch2/
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(
  cmake g++ make pkg-config
  libtorch-dev libgloo-dev libboost-dev libtomlplusplus-dev libspdlog-dev libcli11-dev
  libgtest-dev libdlpack-dev libxxhash-dev zlib1g-dev
  # kiln_exported reads torch.export programs with LibTorch 2.x's schema types, which use it.
  nlohmann-json3-dev
  # The mlflow logger's HTTP client.
  libcurl4-openssl-dev
  # kiln_image_folder's decoders.
  libjpeg62-turbo-dev libpng-dev
  dataset-fashion-mnist
  # The King James Bible as text (public domain): examples/charlm/prepare.sh.
  bible-kjv bible-kjv-text
  # Without it LibTorch runs on Netlib's reference BLAS, ~19x slower on an MLP.
  libopenblas0-openmp
)
BUILD_DIR=${KILN_BUILD_DIR:-build}
# `--torch wheel`: PyPI's torch wheel, a complete LibTorch 2.x (headers,
# libraries, CMake package). PyPI's default Linux wheel is the CUDA one: it
# pulls NVIDIA's runtime wheels too (about 5.4 GB in all); no GPU is needed
# to build or run on CPU.
TORCH_WHEEL_VERSION=2.15.0
# torchvision's release for that torch (the tests' resnet18 only).
TORCHVISION_WHEEL_VERSION=0.29.2
# Hugging Face's libraries the wheel's tests fine-tune models of
# (tests/integration/hugging_face_test.cpp), pinned once, where
# examples/hugging_face's walkthrough installs them from (tokenizers comes
# with transformers).
HF_REQUIREMENTS=examples/hugging_face/requirements.txt
TORCH_VENV=${KILN_TORCH_VENV:-.venv-torch}
TORCH=debian
# The readers tests check kiln's files with (never used by kiln itself).
CHECK_PIP=(tensorboard==2.21.0 safetensors==0.8.0 pillow==12.3.0)
CHECK_VENV=${KILN_CHECK_VENV:-.venv-check}

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
# base_dir: paths relative to the checkout, so worktrees share the cache too.
command -v ccache >/dev/null && export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

torch_args=()
# Idempotent: (re)creates the environment only when the pinned torch is not in it.
install_torch_wheel() {
  local py="$TORCH_VENV/bin/python"
  if ! "$py" -c "import sys, importlib.metadata as m; sys.exit(m.version('torch').split('+')[0] != '$TORCH_WHEEL_VERSION')" 2>/dev/null; then
    if ! python3 -c "import venv, ensurepip" 2>/dev/null; then
      PACKAGES+=(python3-venv)
      install_missing
    fi
    echo "go: installing torch $TORCH_WHEEL_VERSION into $TORCH_VENV"
    rm -rf "$TORCH_VENV"
    python3 -m venv "$TORCH_VENV"
    "$TORCH_VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_WHEEL_VERSION"
  fi
  # The LibTorch root (lib/, include/, share/cmake/): as CMAKE_PREFIX_PATH it
  # finds both the CMake package and the libraries, never the system's.
  local root
  root=$("$py" -c "import os, importlib.util as u; print(os.path.dirname(u.find_spec('torch').origin))")
  # Debian's build, when there is one, for integration.CrossLibTorch.* (skipped without it).
  torch_args=(-DCMAKE_PREFIX_PATH="$root" -DKILN_OTHER_TORCH_BUILD="$PWD/build")
}

# A Python with torch, tensorboard and safetensors for the tests that read
# kiln's files. Against Debian's LibTorch: Debian's python3-torch (the same
# 1.13) in a venv that sees it; against the wheel: the wheel's own Python.
check_args=()
install_check_python() {
  local py
  if [ "$TORCH" = wheel ]; then
    py="$TORCH_VENV/bin/python"
  else
    # scikit-learn: the reference the metrics library and whole-split
    # metrics are checked against (docs/metrics.md).
    # python3-torchvision: the reference for kiln_image_folder's transforms.
    PACKAGES+=(python3-torch python3-venv python3-sklearn python3-torchvision)
    install_missing
    py="$CHECK_VENV/bin/python"
    [ -x "$py" ] || /usr/bin/python3 -m venv --system-site-packages "$CHECK_VENV"
  fi
  # Pillow pinned: the images' reference decodes and resizes (tests/images).
  local also=""
  local hf_pins=""
  [ "$TORCH" = wheel ] && hf_pins=$(sed -n 's/^\([A-Za-z0-9_.-]*==[^ #]*\).*/\1/p' "$HF_REQUIREMENTS" | tr '\n' ' ')
  [ "$TORCH" = wheel ] && also="import torchvision, importlib.metadata as m; assert torchvision.__version__.split('+')[0] == '$TORCHVISION_WHEEL_VERSION'; assert all(m.version(p.split('==')[0]) == p.split('==')[1] for p in '$hf_pins'.split());"
  if ! "$py" -c "import tensorboard, safetensors, torch, sklearn, PIL; assert PIL.__version__ == '12.3.0'; $also" 2>/dev/null; then
    local pip=("${CHECK_PIP[@]}")
    # The wheel's venv does not see Debian's python3-sklearn; torchvision:
    # integration.Exported's resnet18 (the release that goes with the torch).
    # shellcheck disable=SC2206  # the pins are words
    [ "$TORCH" = wheel ] && pip+=(scikit-learn==1.5.2 torchvision==$TORCHVISION_WHEEL_VERSION $hf_pins)
    echo "go: installing ${pip[*]} for the tests' file checks"
    "$py" -m pip install -q --disable-pip-version-check "${pip[@]}"
  fi
  check_args=(-DKILN_CHECK_PYTHON="$PWD/$py")
}

# A real MLflow server and MLflow's own client for the mlflow logger's tests
# (tests/integration/mlflow_test.cpp), in a venv of their own: MLflow pins
# much of the scientific stack, which must not move the check venv's. The
# Debian variant only (one variant suffices: the logger has no LibTorch).
MLFLOW_VERSION=3.17.2
MLFLOW_VENV=${KILN_MLFLOW_VENV:-.venv-mlflow}
install_mlflow_python() {
  local py="$MLFLOW_VENV/bin/python"
  if ! "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('mlflow') != '$MLFLOW_VERSION')" 2>/dev/null; then
    [ -x "$py" ] || /usr/bin/python3 -m venv "$MLFLOW_VENV"
    echo "go: installing mlflow==$MLFLOW_VERSION for the mlflow logger's tests"
    "$py" -m pip install -q --disable-pip-version-check "mlflow==$MLFLOW_VERSION"
  fi
  check_args+=(-DKILN_MLFLOW_PYTHON="$PWD/$py")
}

# build [CMAKE_ARGS...]: configures and builds BUILD_TARGETS (default: all).
BUILD_TARGETS=()
build() {
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "${torch_args[@]}" "${check_args[@]}" "$@" >/dev/null
  cmake --build "$BUILD_DIR" -j2 ${BUILD_TARGETS[@]+--target "${BUILD_TARGETS[@]}"}
}

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

# CI's budget (docs/testing.md, "What each variant runs"). The integration
# tests whose subject is kiln's own logic -- bad input, signals, kills,
# locks, restarts, reports -- behave the same with either LibTorch: Debian's
# variant runs them, the wheel's does not.
KILN_LOGIC_ONLY='^integration\.(Resume/EveryStop|BatchCheck|OpenMpi|Slurm|Processes/Shard|ShardedCheckpoints|Readme|ArraysRefuse|CsvRefuse|ImageFolder/ImageFolderRefuse|ImageFolderDamaged|BadInputs/Catalogue|OneAndTwoProcesses/Signals|SharedMemory|CheckpointCrash|FailureReport|EveryPoint/FaultPoint|Processes/(RunDirLock|ClosedPipe|StuckGetBatch)|KillARankAtARandomStep/FaultInjection|Cli|Restart|Resume|ResumeAuto|Logging|Rank/AbsentPeer|MaxTime|Preemption|RunDirLockRace|EachDefect/LoaderRefuses|BadCheckpoint|Collect/Misuses|StartupAgreement|RanksStartingApart|ValCheckInterval|SanityCheck|OverfitBatches|Profiler|Bf16True|Bf16TrueWithoutMasters)\.'
# Under the sanitizers: the tests that take kiln's code through its inputs,
# files, plugins and collectives, not the ones that mostly wait on kills,
# signals, timeouts and restarts (minutes of process time each, the same
# code paths) or build a plugin (Install). The bad-input catalogue's parsers
# run under AddressSanitizer in the fuzzing pass (./go fuzz) instead. The
# sharded checkpoints' kills and reshards and the rounding bounds of ZeRO-2
# (~140 s of test time there) check numbers and files whose code the
# shorter sharded tests take through the sanitizers too.
NOT_UNDER_SANITIZERS='^integration\.(ShardedCheckpoints|ShardedRoundingApart|RanksStartingApart|Bf16TrueWithoutMasters|Resume/EveryStop|BatchCheck|Torchrun|OpenMpi|Slurm|HuggingFace|Readme|ArraysRefuse|CsvRefuse|ImageFolder|ImageFolderDamaged|ImageFolder/ImageFolderRefuse|Examples/OwnData|BadInputs/Catalogue|OneAndTwoProcesses/Signals|SharedMemory|CheckpointCrash|FailureReport|EveryPoint/FaultPoint|Processes/(RunDirLock|ClosedPipe|StuckGetBatch)|KillARankAtARandomStep/FaultInjection|Restart|ResumeAuto|Rank/AbsentPeer|MaxTime|Preemption|RunDirLockRace|Install|CharLm|CrossLibTorch|Resume/WorldSizes)\.'

# `--torch debian|wheel` may follow the command, before its other options.
cmd=${1:-}
[ $# -gt 0 ] && shift
if [ "${1:-}" = "--torch" ]; then
  TORCH=${2:-}
  shift 2 || true
fi
case "$TORCH" in
  debian) ;;
  wheel)
    case "$cmd" in
      test|build|example|fuzz) ;;
      *) echo "go: --torch wheel goes with test, build, example or fuzz" >&2; exit 2 ;;
    esac
    case "${1:-}" in
      "") ;;
      [0-9]*) [ "$cmd" = fuzz ] || { echo "go: --torch wheel runs the plain suite (no $1)" >&2; exit 2; } ;;
      *) echo "go: --torch wheel runs the plain suite (no $1)" >&2; exit 2 ;;
    esac
    BUILD_DIR=${KILN_BUILD_DIR:-build-torch2}
    ;;
  *) echo "go: --torch takes debian or wheel" >&2; exit 2 ;;
esac
set -- "$cmd" "$@"

case "${1:-}" in
  example)
    install_missing
    [ "$TORCH" = wheel ] && install_torch_wheel
    # Only what the example runs: the host and the shipped plugins (no tests,
    # benchmarks or in-tree examples; ./go test and ./go build build those).
    BUILD_TARGETS=(kiln kiln_shipped_plugins)
    build
    "$BUILD_DIR/bin/kiln" fit examples/fashion_mnist/mlp.toml
    ;;
  test)
    # The real launchers integration.{OpenMpi,Slurm}.* run kiln under:
    # Open MPI's mpirun, and a one-node SLURM cluster with munge.
    PACKAGES+=(openmpi-bin slurmctld slurmd slurm-client munge)
    install_missing
    [ "$TORCH" = wheel ] && install_torch_wheel
    install_check_python
    case "${2:-}" in
      --sanitize)
        BUILD_DIR=${KILN_BUILD_DIR:-build-asan}
        # -O1: what AddressSanitizer is meant to be used with, and a third
        # less compile time than RelWithDebInfo's -O2.
        # Only what the tests below run (no GPU or accuracy tests, no bench).
        # The plugins are not instrumented: the plain Debian build's are used
        # (KILN_PLUGINS_FROM), built first where they are not yet.
        plain=$PWD/${KILN_PLAIN_BUILD_DIR:-build}
        (BUILD_DIR=$plain; BUILD_TARGETS=(kiln_every_plugin); build)
        BUILD_TARGETS=(kiln_unit_tests kiln_sdk_metrics_tests kiln_integration_tests)
        build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" \
          -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" -DKILN_SANITIZE=address,undefined -DKILN_BUILD_BENCH=OFF \
          -DKILN_PLUGINS_FROM="$plain"
        export_sanitizer_options
        # The slow checks marked for one plain variant (KILN_ONLY_IN_VARIANT) skip here.
        export KILN_TEST_VARIANT=sanitize
        ctest --test-dir "$BUILD_DIR" --output-on-failure -j3 -R '^(unit|integration)\.' -E "$NOT_UNDER_SANITIZERS"
        ;;
      --tsan)
        BUILD_DIR=${KILN_BUILD_DIR:-build-tsan}
        cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=thread \
          -DKILN_BUILD_BENCH=OFF "${launcher[@]}" >/dev/null
        cmake --build "$BUILD_DIR" -j2 --target kiln_unit_tests
        export_sanitizer_options
        "$BUILD_DIR/bin/kiln_unit_tests" \
          --gtest_filter='Supervisor.*:Restarts.*:Heartbeat.*:SignalWatcher.*:PrefetcherTest.*:BackgroundCommit.*'
        ;;
      "")
        if [ "$TORCH" = wheel ]; then
          # A build for this suite only (never benchmarked): -O1 compiles in
          # about two thirds of -O3's time; LibTorch's kernels are built already.
          build -DKILN_BUILD_BENCH=OFF -DKILN_TEST_TWINS=OFF -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG"
        else
          install_mlflow_python
          build
        fi
        # Slow checks run in one variant only (KILN_ONLY_IN_VARIANT, docs/testing.md).
        export KILN_TEST_VARIANT=$TORCH
        # -j3 on two cores: a test waits on its processes' start-up and
        # sockets part of the time (the suite keeps ~1.9 cores busy).
        if [ "$TORCH" = wheel ]; then
          ctest --test-dir "$BUILD_DIR" --output-on-failure -j3 -E "$KILN_LOGIC_ONLY"
        else
          ctest --test-dir "$BUILD_DIR" --output-on-failure -j3
        fi
        ;;
      *)
        echo "usage: ./go test [--torch debian|wheel] [--sanitize | --tsan]" >&2
        exit 2
        ;;
    esac
    ;;
  fuzz)
    install_missing
    if [ "$TORCH" = wheel ]; then
      # The target that needs LibTorch 2.x (the .pt2 reader of kiln_exported),
      # against the wheel's, in build-fuzz-torch2/.
      install_torch_wheel
      KILN_FUZZ_TORCH_PREFIX=$("$TORCH_VENV/bin/python" -c "import os, importlib.util as u; print(os.path.dirname(u.find_spec('torch').origin))") \
        tests/fuzz/run.sh "${2:-30}" pt2
    else
      tests/fuzz/run.sh "${2:-30}"
    fi
    ;;
  build)
    install_missing
    [ "$TORCH" = wheel ] && install_torch_wheel
    build
    ;;
  *)
    echo "usage: ./go example | test [--sanitize | --tsan] | build | fuzz [SECONDS]" >&2
    echo "       ./go fuzz --torch wheel [SECONDS]   (the .pt2 reader's target)" >&2
    echo "       ./go example | test | build  --torch wheel   (LibTorch $TORCH_WHEEL_VERSION from PyPI)" >&2
    exit 2
    ;;
esac
