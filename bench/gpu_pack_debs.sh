#!/usr/bin/env bash
# Run HERE (Debian bookworm, apt works): downloads the Debian packages kiln
# needs that a GPU machine lacks (it has PyTorch, CMake and nvcc, no Debian
# -dev packages, no network) into a folder the device tool carries to it
# (default shared/debs/, git-ignored). bench/gpu.sh extracts them there.
#   bench/gpu_pack_debs.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-shared/debs}
mkdir -p "$dir"
packages=(
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9      # logging (spdlog is compiled against fmt 9)
  libtomlplusplus-dev libcli11-dev                    # manifest, command line
  libboost1.74-dev                                    # Boost.DLL (header-only)
  libgloo-dev                                         # c10d's Gloo headers
  libdlpack-dev libxxhash-dev libxxhash0 zlib1g-dev   # DLPack, checkpoint checksums, gzip'd IDX
  libgtest-dev                                        # the tests (static libraries)
  dataset-fashion-mnist                               # the benchmark's data
)
(cd "$dir" && apt-get download "${packages[@]}" >/dev/null)
echo "gpu_pack_debs: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir"
