# Sourced by the largest-model scripts (bench/shard_largest.sh,
# bench/shard_largest_llama.sh): a private copy of kiln, and each process's
# peak RSS while a run goes on.

# private_kiln BUILD: $out (a temporary folder, removed at exit with any
# process still in $live) and $kiln, a copy of BUILD's kiln and its plugins
# (found at <kiln>/../lib/kiln/plugins): a build running beside this one may
# relink them mid-run.
private_kiln() {
  out=$(mktemp -d)
  live=()
  trap 'for p in "${live[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$out"' EXIT
  mkdir -p "$out/kiln/bin" "$out/kiln/lib/kiln"
  cp "$1/bin/kiln" "$out/kiln/bin/"
  cp -r "$1/lib/kiln/plugins" "$out/kiln/lib/kiln/"
  kiln="$out/kiln/bin/kiln"
  "$kiln" --version >/dev/null
}

# watch_peaks LAUNCHER PATTERN LIMIT_BYTES MIN_AVAILABLE_KIB LOG WHAT: until
# LAUNCHER exits, the VmHWM (KiB) of each process whose command line holds
# PATTERN, into the associative array `hwm` (the caller's, declared with
# local -A); every process is killed, and the script ends with LOG's tail,
# if their RSS sums past LIMIT_BYTES or MemAvailable falls under
# MIN_AVAILABLE_KIB. WHAT names the run in that line.
watch_peaks() {
  local launcher=$1 pattern=$2 limit=$3 min_avail=$4 log=$5 what=$6 p v avail rss
  while kill -0 "$launcher" 2>/dev/null; do
    live=($(pgrep -f "$pattern" || true))
    for p in "${live[@]}"; do
      v=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || true)
      [ -n "$v" ] && hwm[$p]=$v
    done
    avail=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
    rss=$(for p in "${live[@]}"; do awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || true; done |
      awk '{s += $1} END {print s + 0}')
    if [ "$avail" -lt "$min_avail" ] || [ $((rss * 1024)) -gt "$limit" ]; then
      for p in "${live[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
      echo "RSS $((rss / 1024)) MB, MemAvailable $((avail / 1024)) MB: killed the run at $what" >&2
      tail -20 "$log" >&2
      exit 1
    fi
    sleep 0.2
  done
  live=()
}
