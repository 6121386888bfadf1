#!/usr/bin/env bash
# A model written in Python and trained by kiln from its torch.export
# programs (kiln_exported) against the same model as kiln's C++ plugin
# (kiln_mlp), a plain PyTorch eager loop and torch.compile, all on the torch
# wheel's LibTorch, in one run, alternating, medians of the epochs
# (shared/bench-definition.md's mlp32 and mlp256, one thread).
# Usage: bench/exported.sh [rounds]   (needs ./go build --torch wheel)
# Run it on an otherwise idle machine; timings are not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
build=${KILN_BUILD_DIR:-build-torch2}
py=${KILN_TORCH_PYTHON:-.venv-torch/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
kiln_epochs() {  # manifest extra-args... -> epoch seconds, one a line
  rm -rf "$out/run"
  "$build/bin/kiln" fit "$@" --set run.threads=1 --set run.dir="$out/run" >"$out/kiln.log" 2>&1 </dev/null
  awk -F, 'NR==1 {for(i=1;i<=NF;i++) if($i=="epoch_seconds") c=i; next} c && $c!="" {print $c}' "$out/run/metrics.csv"
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for model in mlp32 mlp256; do
  "$py" bench/exported_eager.py export "$model" "$out/$model.pt2" 2>/dev/null
  sed -e 's/^path = "kiln_mlp"$/path = "kiln_exported"/' -e '/^hidden = /d' "bench/$model.toml" >"$out/$model.exported.toml"
  awk -v p="program = \"$out/$model.pt2\"" '{print} /^path = "kiln_exported"$/ {print p}' "$out/$model.exported.toml" >"$out/$model.x.toml"
  for side in cpp exported eager compile; do : >"$out/$side"; done
  for r in $(seq 1 "$rounds"); do
    kiln_epochs "bench/$model.toml" >>"$out/cpp"
    kiln_epochs "$out/$model.x.toml" >>"$out/exported"
    "$py" bench/exported_eager.py eager "$model" 1 2>/dev/null | awk '$1=="epoch" {print $4}' >>"$out/eager"
    "$py" bench/exported_eager.py compile "$model" 1 2>/dev/null | awk '$1=="epoch" {print $4}' >>"$out/compile"
  done
  c=$(median <"$out/cpp"); e=$(median <"$out/exported"); p=$(median <"$out/eager"); t=$(median <"$out/compile")
  printf '%s  s/epoch: kiln C++ %.3f  kiln exported %.3f  eager %.3f  compile %.3f   exported/C++ %.3f  exported/eager %.3f\n' \
    "$model" "$c" "$e" "$p" "$t" "$(echo "$e / $c" | bc -l)" "$(echo "$e / $p" | bc -l)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
