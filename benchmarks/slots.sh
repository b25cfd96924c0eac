#!/usr/bin/env bash
# What consumer_budget.running_max costs each run of a consumer that finds a
# free slot, on Debian 13 (systemd 257: the unit takes a slot itself) and on
# Debian testing (262: the slice holds starts back, the unit measures the wait).
# Usage: make images && benchmarks/slots.sh [RUNS]
# Prints, per host, the median (and range) wall time of `systemctl start` of a
# oneshot that runs /bin/true: as a plain unit, and as the role writes a
# consumer's unit under a running cap (its ExecStartPre=, ExecStopPost= and
# slice, the runtime spec with metrics; before 258 the batch runs through
# the runner, batchq-drain). Nothing else runs in the slice: no
# run waits, so the difference is what the slots cost.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
prefix=${BATCHQ_HOST_PREFIX:-batchq}-slots-bench
hosts=("$prefix-debian13" "$prefix-debiantesting")
trap 'docker rm -f "${hosts[@]}" >/dev/null 2>&1 || true' EXIT
tools/systemd-container.sh "${hosts[0]}" "${BATCHQ_IMAGE_DEBIAN13:-batchq/debian:trixie}"
CGROUP_SOURCE=/sys/fs/cgroup/unified tools/systemd-container.sh "${hosts[1]}" \
  "${BATCHQ_IMAGE_DEBIANTESTING:-batchq/debian:forky}"
for host in "${hosts[@]}"; do
  docker exec "$host" mkdir -p /usr/local/lib/batchq/specs
  for file in batchq_slots.py batchq_journal.py batchq_metrics.py consumer_protocol.py batchq-drain \
      batchq_supervise.py batchq_cpython.py batchq_main.py batchq_preload.py batchq_reseed.py; do
    docker cp -L "roles/consumer/files/$file" "$host:/usr/local/lib/batchq/$file"
  done
  docker exec -i "$host" python3 - "$runs" <<'PY'
import json, os, statistics, subprocess, sys, time

runs = int(sys.argv[1])
version = int(subprocess.run(["systemctl", "--version"], stdout=subprocess.PIPE, text=True).stdout.split()[1])
folder = "/var/lib/prometheus/node-exporter/batchq-bench.d"
os.makedirs(folder, exist_ok=True)
# the runtime spec the role writes for such a consumer (module_utils/consumer_runtime.py)
spec = {"spec_version": 1, "consumer": "bench", "services": ["batchq-bench.service"], "backlog_exit_code": None,
        "timeout_usec": 60000000, "stop_timeout_usec": 30000000, "interval_usec": 60000000, "preload": [],
        "metrics_folder": folder, "hooks": None, "hook_credentials": None, "running_max": 2,
        "runner": version < 258}
with open("/usr/local/lib/batchq/specs/batchq-bench.json", "w", encoding="utf-8") as handle:
    json.dump(spec, handle)
slots = "/usr/bin/python3 -I /usr/local/lib/batchq/batchq_slots.py --spec /usr/local/lib/batchq/specs/batchq-bench.json --unit %n"
# as consumer.service.j2 writes them
plain = "[Service]\nType=oneshot\nExecStart=/bin/true\nTimeoutStartSec=60\n"
if version >= 258:
    capped = plain + "Slice=batchq.slice\nExecStartPre=+%s waited\n" % slots
    budget = "[Slice]\nConcurrencySoftMax=2\n"
else:  # the batch runs through the runner, which times it out
    capped = ("[Service]\nType=oneshot\nTimeoutStartSec=infinity\nSlice=batchq.slice\nNotifyAccess=exec\n"
              "ExecStart=/usr/bin/python3 -I /usr/local/lib/batchq/batchq-drain --spec "
              "/usr/local/lib/batchq/specs/batchq-bench.json --unit %%n -- /bin/true\n"
              "ExecStartPre=+%s take\nExecStopPost=-+%s give\n" % (slots, slots))
    budget = "[Slice]\n"
units = {"batchq-bench-plain.service": plain, "batchq-bench.service": capped, "batchq.slice": budget}
for name, text in units.items():
    with open("/etc/systemd/system/" + name, "w", encoding="utf-8") as handle:
        handle.write(text)
subprocess.run(["systemctl", "daemon-reload"], check=True)


def start(unit):
    began = time.monotonic()
    subprocess.run(["systemctl", "start", unit], check=True)
    return time.monotonic() - began


def ms(samples):
    samples = sorted(samples)
    return "%.1f ms (%.1f-%.1f)" % (statistics.median(samples) * 1e3, samples[0] * 1e3, samples[-1] * 1e3)


times = {unit: [] for unit in ("batchq-bench-plain.service", "batchq-bench.service")}
for unit in times:
    start(unit)  # warm the page cache
for _ in range(runs):  # by turns, so that both see the same machine
    for unit in times:
        times[unit].append(start(unit))
if version < 258:
    assert os.listdir("/run/batchq/slots/held") == [], "a slot was not given back"
plain, capped = (statistics.median(times[unit]) for unit in times)
print("systemd %d: a run without the cap %s, with it %s: %.1f ms more, median of %d"
      % (version, ms(times["batchq-bench-plain.service"]), ms(times["batchq-bench.service"]),
         (capped - plain) * 1e3, runs))
PY
done
