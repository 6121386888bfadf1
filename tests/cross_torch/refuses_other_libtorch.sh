#!/usr/bin/env bash
# A plugin built against the other LibTorch (Debian's 1.13 and a 2.x wheel)
# is refused in both directions: one line naming the cause, exit 2, and no
# run directory. Usage: refuses_other_libtorch.sh THIS_BUILD OTHER_BUILD
# (build directories: bin/kiln and lib/kiln/plugins/ in each). Exit 77
# (CTest's skip) with one line when OTHER_BUILD has not been built.
set -uo pipefail
this=$1 other=$2
for b in "$this" "$other"; do
  if [ ! -x "$b/bin/kiln" ] || [ ! -f "$b/lib/kiln/plugins/libkiln_mlp.so" ]; then
    echo "skipped: no kiln and plugins built in $b (build both: ./go build; ./go build --torch wheel)"
    exit 77
  fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
check() {  # HOST_BUILD PLUGIN_BUILD
  local host=$1/bin/kiln plugin=$2/lib/kiln/plugins/libkiln_mlp.so dir=$tmp/$3
  mkdir -p "$dir"
  cat > "$dir/run.toml" <<TOML
[run]
name = "cross"
dir = "$dir/run"
[model]
path = "$plugin"
[data]
path = "kiln_synthetic"
[trainer]
max_epochs = 1
progress = "none"
TOML
  local out rc
  out=$("$host" fit "$dir/run.toml" 2>&1)
  rc=$?
  local lines
  lines=$(printf '%s\n' "$out" | grep -c .)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q "kiln: error: .*was built against another LibTorch" <<<"$out" \
     || [ -e "$dir/run" ]; then
    echo "FAIL $3: $host loading $plugin: exit $rc, $lines line(s):"
    printf '%s\n' "$out" | head -20
    failed=1
  else
    echo "ok   $3: $out"
  fi
}
check "$this" "$other" this_host_other_plugin
check "$other" "$this" other_host_this_plugin
exit $failed
