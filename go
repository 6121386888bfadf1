#!/usr/bin/env bash
# One entry point for a fresh Debian bookworm machine. Idempotent.
#   ./go example   install what is missing, build, train the Fashion-MNIST MLP
#   ./go test      install what is missing, build, run the whole test suite
#   ./go build     install what is missing and build only
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

build() {
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD_DIR" -j2
}

case "${1:-}" in
  example)
    install_missing
    build
    "$BUILD_DIR/bin/kiln" fit examples/fashion_mnist/mlp.toml
    ;;
  test)
    install_missing
    build
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j2
    ;;
  build)
    install_missing
    build
    ;;
  *)
    echo "usage: ./go example | test | build" >&2
    exit 2
    ;;
esac
