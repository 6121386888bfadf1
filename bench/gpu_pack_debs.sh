#!/usr/bin/env bash
# Run HERE, on the Debian bookworm development machine (apt works): downloads
# the Debian packages that kiln's build, its gpu tests and the GPU benchmark
# need and that the GPU machine lacks (it has PyTorch with CUDA, CMake, nvcc
# and a C++ compiler, but no Debian -dev packages and no network).
# bench/gpu.sh unpacks them there with `dpkg -x` into a prefix.
#
#   bench/gpu_pack_debs.sh [DIR]      (default: shared/debs in the repository)
#
# The device tool sends the session's checkout and its shared/ folder, so the
# default needs no `carry`; any other folder inside the checkout must be
# git-ignored and named in the run's `carry`. The default is git-ignored
# (/shared/debs/ in .gitignore, or added to .git/info/exclude here).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-shared/debs}

packages=(
  # kiln_logging: spdlog 1.10 is a shared library built against {fmt} 9,
  # so the runtime libraries come too (libspdlog.so.1.10, libfmt.so.9)
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  # header-only: the manifest (toml++), the command line (CLI11), Boost.DLL
  # (BOOST_DLL_USE_STD_FS: no Boost library), c10d's Gloo headers (the Gloo
  # code itself is inside libtorch_cpu), DLPack (examples/c_data_module)
  libtomlplusplus-dev libcli11-dev libboost1.74-dev libgloo-dev libdlpack-dev
  # checkpoint checksums: find_library(xxhash) links libxxhash.so -> .so.0
  libxxhash-dev libxxhash0
  # the IDX reader (ZLIB::ZLIB); zlib1g for the library that libz.so points at
  zlib1g-dev zlib1g
  # kiln_image_folder's decoders, with the libraries their .so links point at
  libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16
  # the tests: static libgtest.a / libgtest_main.a and the CMake package
  libgtest-dev
  # the data: /usr/share/datasets/fashion-mnist/*.gz
  dataset-fashion-mnist
)

mkdir -p "$dir"
# Nothing downloaded here may end up in a commit.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && ! git check-ignore -q "$dir/x.deb" 2>/dev/null; then
  case "$(realpath "$dir")/" in
    "$(realpath .)"/*)
      rel=$(realpath --relative-to=. "$dir")
      echo "/$rel/" >>"$(git rev-parse --git-common-dir)/info/exclude"
      echo "gpu_pack_debs: $dir was not git-ignored: added /$rel/ to .git/info/exclude" ;;
  esac
fi
rm -f "$dir"/*.deb
(cd "$dir" && apt-get download "${packages[@]}")
count=$(find "$dir" -maxdepth 1 -name '*.deb' | wc -l)
bytes=$(find "$dir" -maxdepth 1 -name '*.deb' -printf '%s\n' | awk '{s += $1} END {print s}')
echo "gpu_pack_debs: $count packages, $(awk -v b="$bytes" 'BEGIN {printf "%.1f MiB", b / 1048576}') in $dir"
[ "$count" -eq "${#packages[@]}" ] || { echo "gpu_pack_debs: expected ${#packages[@]} packages" >&2; exit 1; }
