#!/usr/bin/env bash
# What writing the Prometheus metrics costs per batch, on one Debian 12 host.
# Usage: make images && benchmarks/metrics.sh [RUNS]
# Prints the median (and range) of
#  - a plain consumer: the unit's ExecStopPost= command, batchq_after_run.py
#    with the consumer's runtime spec, as systemd runs it after a batch
#    (python3, the spec, systemctl show, the file), wall time added to each run;
#  - a drain: one update() in the runner after each batch of a consumer whose
#    file already holds 4 instances' series.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
host=${BATCHQ_HOST_PREFIX:-batchq}-metrics-bench
trap 'docker rm -f "$host" >/dev/null 2>&1 || true' EXIT
tools/systemd-container.sh "$host" "${BATCHQ_IMAGE_DEBIAN12:-batchq/debian:bookworm}"
docker exec "$host" mkdir -p /usr/local/lib/batchq
for file in batchq_metrics.py batchq_after_run.py consumer_protocol.py; do
  docker cp -L "roles/consumer/files/$file" "$host:/usr/local/lib/batchq/$file"
done
for _ in $(seq 60); do
  docker exec "$host" systemctl is-system-running 2>/dev/null | grep -qE '^(running|degraded)$' && break
  sleep 1
done
docker exec "$host" sh -c 'mkdir -p /var/lib/prometheus/node-exporter/batchq-bench.d &&
  systemd-run --quiet --wait --unit=batchq-bench /bin/true'

docker exec -i "$host" python3 - "$runs" <<'PY'
import json, os, statistics, subprocess, sys, time
sys.path.insert(0, "/usr/local/lib/batchq")
import batchq_metrics

runs = int(sys.argv[1])
folder = "/var/lib/prometheus/node-exporter/batchq-bench.d"
# the runtime spec the role writes for such a consumer (module_utils/consumer_runtime.py)
spec = {"spec_version": 1, "consumer": "bench", "services": ["batchq-bench.service"], "backlog_exit_code": None,
        "timeout_usec": 3600000000, "stop_timeout_usec": 30000000, "interval_usec": 60000000, "preload": [],
        "metrics_folder": folder, "hooks": None, "hook_credentials": None, "running_max": None}
os.makedirs("/usr/local/lib/batchq/specs", exist_ok=True)
with open("/usr/local/lib/batchq/specs/batchq-bench.json", "w", encoding="utf-8") as handle:
    json.dump(spec, handle)
env = dict(os.environ, SERVICE_RESULT="success", EXIT_CODE="exited", EXIT_STATUS="0")
argv = ["/usr/bin/python3", "-I", "/usr/local/lib/batchq/batchq_after_run.py",
        "--spec", "/usr/local/lib/batchq/specs/batchq-bench.json", "--unit", "batchq-bench.service"]
subprocess.run(argv, env=env, check=True)  # warm the page cache and __pycache__


def ms(samples):
    samples = sorted(samples)
    return "%.1f ms (%.1f-%.1f)" % (statistics.median(samples) * 1e3, samples[0] * 1e3, samples[-1] * 1e3)


plain = []
for _ in range(runs):
    began = time.monotonic()
    subprocess.run(argv, env=env, check=True)
    plain.append(time.monotonic() - began)
# the writer did its work: every run counted (the warm-up too)
with open(os.path.join(folder, "metrics.prom"), encoding="utf-8") as handle:
    counted = [line for line in handle if line.startswith('batchq_consumer_runs_total{') and 'result="success"' in line]
assert counted and float(counted[0].split()[-1]) == runs + 1, counted
drain = []
for n in range(runs * 10):
    run = {"result": "backlog", "status": 75, "started": time.time() - 0.1, "ended": time.time()}
    began = time.monotonic()
    batchq_metrics.update(folder, "bench", "batchq-bench@%d.service" % (n % 4 + 1), run, 60.0, 3600.0)
    drain.append(time.monotonic() - began)
print("plain consumer, ExecStopPost= writer per run: %s, median of %d" % (ms(plain), runs))
print("drain, update() per batch (4 instances in the file): %s, median of %d" % (ms(drain), runs * 10))
PY
