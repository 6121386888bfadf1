#!/usr/bin/env bash
# What the mlflow logger costs the step loop: the overhead-bound mlp32
# (bench/mlp32.toml), 1 thread, a step row every step (log_every_n_steps = 1:
# 1,875 rows an epoch, 4 points each), with
#   none         logging.loggers = []
#   jsonl        logging.loggers = ["jsonl"]: what any logger of step rows
#                costs (the rows themselves: the loss read back each step)
#   mlflow       a real `mlflow server` on loopback (SQLite store)
#   mlflow-slow  a server that answers every log-batch after 5 s (Python's
#                http.server), so the background thread is always waiting
# alternated ROUNDS times, 5 epochs a run; the median of each side's epochs
# (kiln's first epoch of each run left out as its warm-up). Needs the mlflow venv of
# ./go test (.venv-mlflow, or KILN_MLFLOW_PYTHON).
# kiln runs on CPU 0 and the servers on CPU 1 (taskset), as a server on
# another machine would: everything the logger does, its shipping thread
# included, is paid on the training's core, and the server's own work is
# not (KILN_BENCH_PIN=0: no pinning, all of it sharing the cores).
#   bench/mlflow.sh [ROUNDS]      (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
py=${KILN_MLFLOW_PYTHON:-.venv-mlflow/bin/python}
rounds=${1:-3}
cmake --build "$build" -j2 --target kiln kiln_mlp kiln_fashion_mnist >/dev/null
out=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null || true; done; [ -n "${KILN_BENCH_KEEP:-}" ] && cp "$out"/*.times "$out"/*.cpu "$KILN_BENCH_KEEP"/; rm -rf "$out"' EXIT
port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

kiln_cpu=() server_cpu=()
if [ "${KILN_BENCH_PIN:-1}" != 0 ] && [ "$(nproc)" -ge 2 ]; then kiln_cpu=(taskset -c 0) server_cpu=(taskset -c 1); fi
real=$(port)
setsid "${server_cpu[@]}" "$(dirname "$py")/mlflow" server --backend-store-uri "sqlite:///$out/mlflow.db" --default-artifact-root "$out/a" \
  --host 127.0.0.1 --port "$real" --workers 1 >"$out/server.log" 2>&1 &
pids+=($!)
slow=$(port)
cat >"$out/slow.py" <<PY
import http.server, json, time
class H(http.server.BaseHTTPRequestHandler):
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({"experiment": {"experiment_id": "1"}})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.endswith("runs/create"):
            return self.reply({"run": {"info": {"run_id": "slow"}}})
        time.sleep(5)
        self.reply({})
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", $slow), H).serve_forever()
PY
setsid "${server_cpu[@]}" "$py" "$out/slow.py" &
pids+=($!)
for i in $(seq 1 300); do curl -sf "http://127.0.0.1:$real/health" >/dev/null && break; sleep 0.2; done

run() {  # run <name> <loggers> [uri]
  local name=$1 loggers=$2 uri=${3:-}
  local args=(--set trainer.max_epochs=5 --set trainer.log_every_n_steps=1 --set trainer.progress=none --set trainer.test_after_fit=false
    --set "logging.loggers=$loggers" --set run.dir="$out/run-$name" --set logging.mlflow.finish_timeout_s=1
    --set logging.mlflow.required=false)
  [ -n "$uri" ] && args+=(--set "logging.mlflow.tracking_uri=$uri")
  # The run's CPU time, all its threads (the logger's writer and shipper
  # too): what the logger costs even where it runs beside the training.
  /usr/bin/time -f "%U %S" -o "$out/$name.cpu1" "${kiln_cpu[@]}" "$build/bin/kiln" fit bench/mlp32.toml "${args[@]}" \
    >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
  awk '{print $1 + $2}' "$out/$name.cpu1" >>"$out/$name.cpu"
  # Epochs 1 to 4 (epoch 0 is the warm-up).
  # The line's seconds have two decimals (1 % of these epochs); its
  # samples/s has six digits: the epoch's 60,000 samples over it.
  grep -o 'epoch [1-9]/[0-9]* .*, \([0-9]*\) samples/s' "$out/$name.log" |
    sed 's/.*, \([0-9]*\) samples\/s/\1/' | awk '{printf "%.5f\n", 60000 / $1}' >>"$out/$name.times"
}
for r in $(seq 1 "$rounds"); do
  run none '[]'
  run jsonl '["jsonl"]'
  run mlflow '["mlflow"]' "http://127.0.0.1:$real"
  run mlflow-slow '["mlflow"]' "http://127.0.0.1:$slow"
done
median() { sort -n "$1" | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
base=$(median "$out/none.times")
cbase=$(median "$out/none.cpu")
printf "%-12s %14s %10s %16s %18s\n" loggers "epoch s (med)" "vs none" "run CPU s (med)" "CPU us/step vs none"
for name in none jsonl mlflow mlflow-slow; do
  m=$(median "$out/$name.times")
  c=$(median "$out/$name.cpu")
  printf "%-12s %14s %10s %16s %18s\n" "$name" "$m" "$(awk -v a="$m" -v b="$base" 'BEGIN {printf "%.3f", a / b}')" "$c" \
    "$(awk -v a="$c" -v b="$cbase" -v n="$((5 * 1875))" 'BEGIN {printf "%+.1f", (a - b) / n * 1e6}')"
done
grep -h "records not sent\|has every point" "$out"/mlflow*.log | sed 's/^/  /' | sort | uniq -c | head -4
# Where the logger's time goes, by thread (perf, when the machine has it):
# one more real-server run, all of kiln on one core, sampled; mlflow-send
# and mlflow-spool are the logger's threads, kiln the training's (its
# logging code is the share of MlflowLogger::log and metric_key in it).
if command -v perf >/dev/null && perf record -q -o "$out/probe.data" true 2>/dev/null; then
  perf record -q -F 10000 -o "$out/perf.data" -- taskset -c 0 "$build/bin/kiln" fit bench/mlp32.toml \
    --set trainer.max_epochs=3 --set trainer.log_every_n_steps=1 --set trainer.progress=none \
    --set trainer.test_after_fit=false --set 'logging.loggers=["mlflow"]' --set run.dir="$out/run-perf" \
    --set logging.mlflow.required=false --set "logging.mlflow.tracking_uri=http://127.0.0.1:$real" >"$out/perf.log" 2>&1
  echo "perf, one core, share of kiln's CPU samples by thread:"
  perf report -q -i "$out/perf.data" --sort comm --stdio 2>/dev/null | grep '%' | sed 's/^ */  /'
  echo "  of which the training thread's logger calls:"
  perf report -q -i "$out/perf.data" --comm kiln --sort sym --stdio 2>/dev/null |
    grep -E "MlflowLogger|QueuedPoint|now_ms|Loggers::log" | sed 's/^ */    /'
fi
