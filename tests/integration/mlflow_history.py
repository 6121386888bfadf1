"""Reads a kiln run back from an MLflow server with MLflow's own client and
checks it against the run directory: every metric's history
(get_metric_history) equals metrics.jsonl's points for that name, and, for
the names metrics.csv has, metrics.csv's column, exactly (value, step, count:
nothing lost, nothing twice). Also the params, the status, the final
checkpoint tag and the run id kiln recorded.

usage: mlflow_history.py TRACKING_URI RUN_DIR [--status FINISHED] [--param key=value ...] [--timing-may-differ]
                         [--files-within]

--timing-may-differ: after a kill and a resume, the timing metrics
(*samples_per_sec*, *step_time*, epoch_seconds) of the steps both runs logged are the first
run's in MLflow (it keeps the first value; kiln recomputes every other
metric bit for bit), the resumed run's in the files: for those keys only the
steps and the number of points must be equal.
--files-within: the files are a later command's (`kiln validate` or `kiln
test` in a fit's directory, logging into the fit's run): every point they
hold is in the run's history, beside the fit's.
Prints one line "ok: ..." and exits 0, or says what differs and exits 1.
"""
import csv
import json
import math
import os
import sys

from mlflow.tracking import MlflowClient


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def timing(name):
    # Every wall-clock measurement kiln logs: a killed run can log an epoch's
    # row and die committing its checkpoint, so the resumed run times it again.
    return "samples_per_sec" in name or "step_time" in name or name == "epoch_seconds"


def points_of_csv(path):
    out = {}
    if not os.path.exists(path):  # no epoch row yet (a run that failed in its first epoch)
        return out
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(row["step"])
            for k, v in row.items():
                if k == "step" or v == "" or v is None:
                    continue
                out.setdefault(k, []).append((step, float(v)))
    return out


def points_of_jsonl(path):
    out = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            step = row["step"]
            if row["kind"] == "epoch":
                out.setdefault("epoch", []).append((step, float(row["epoch"])))
            for k, v in row.items():
                if k in ("kind", "epoch", "step"):
                    continue
                out.setdefault(k, []).append((step, float("nan") if v is None else float(v)))
    return out


def main():
    uri, run_dir = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    status = None
    params = {}
    timing_may_differ = False
    within = False
    while args:
        if args[0] == "--files-within":
            within = True
            args = args[1:]
        elif args[0] == "--timing-may-differ":
            timing_may_differ = True
            args = args[1:]
        elif args[0] == "--status":
            status = args[1]
            args = args[2:]
        elif args[0] == "--param":
            k, v = args[1].split("=", 1)
            params[k] = v
            args = args[2:]
        else:
            sys.exit("unknown argument " + args[0])
    info = json.load(open(os.path.join(run_dir, "mlflow", "run.json")))
    run_id = info["run_id"]
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    problems = []
    runs = client.search_runs([run.info.experiment_id])
    if len(runs) != 1:
        problems.append(f"the experiment holds {len(runs)} runs, not 1")
    expected = points_of_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    from_csv = points_of_csv(os.path.join(run_dir, "metrics.csv"))
    names = set(expected) | set(run.data.metrics)
    for name in sorted(names):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
        want = sorted(expected.get(name, []))
        loose = timing_may_differ and timing(name)
        if within:
            missing = [w for w in want if not any(h[0] == w[0] and same(h[1], w[1]) for h in history)]
            if missing:
                problems.append(f"{name}: MLflow's history {history[:6]} lacks the files' {missing[:6]}")
            continue
        if len(history) != len(want) or not all(h[0] == w[0] and (loose or same(h[1], w[1])) for h, w in zip(history, want)):
            problems.append(f"{name}: MLflow has {history[:6]}{'...' if len(history) > 6 else ''} ({len(history)} points), "
                            f"metrics.jsonl {want[:6]} ({len(want)} points)")
    for name, want in from_csv.items():
        if name in ("epoch",) and name not in expected:
            continue
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
        got = [p for p in history if p[0] in {s for s, _ in want}]
        want = sorted(want)
        if within:
            missing = [w for w in want if not any(g[0] == w[0] and same(g[1], w[1]) for g in got)]
            if missing:
                problems.append(f"{name}: MLflow's history lacks metrics.csv's {missing[:6]}")
            continue
        loose = timing_may_differ and timing(name)
        if len(got) != len(want) or not all(g[0] == w[0] and (loose or same(g[1], w[1])) for g, w in zip(got, want)):
            problems.append(f"{name}: MLflow has {got[:6]} at metrics.csv's steps, metrics.csv {want[:6]}")
    if status and run.info.status != status:
        problems.append(f"status {run.info.status}, not {status}")
    for k, v in params.items():
        if run.data.params.get(k) != v:
            problems.append(f"param {k} = {run.data.params.get(k)!r}, not {v!r}")
    if status == "FINISHED":
        tag = run.data.tags.get("kiln.final_checkpoint", "")
        if tag and not os.path.exists(tag):
            problems.append(f"kiln.final_checkpoint names {tag}, which does not exist")
    for key, value in run.data.tags.items():
        for secret in ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
            if os.environ.get(secret) and os.environ[secret] in value:
                problems.append(f"tag {key} holds {secret}")
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    total = sum(len(v) for v in expected.values())
    print(f"ok: run {run_id}: {len(names)} metrics, {total} points equal metrics.jsonl and metrics.csv; "
          f"{len(run.data.params)} params; status {run.info.status}; tags {sorted(run.data.tags)}")


main()
