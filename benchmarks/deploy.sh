#!/usr/bin/env bash
# What a deploy that changes nothing costs: 51 consumers (one a drain) re-deployed to hosts
# that already have them, on 1 and on 4 Debian 12 hosts.
# Usage: make collection images && benchmarks/deploy.sh [ROUNDS]
# Prints the remote runs per host (the EXEC lines of -vvv: each is one
# round trip that runs Python on the host: the modules and Ansible's interpreter
# discovery), then for each round the wall time
# and the controller's CPU time (user + system, ansible-playbook and its
# children) on 1 and on 4 hosts, and the medians: the CPU per host on 1 and
# on 4 hosts side by side, and the CPU per extra host, (CPU on 4 - CPU on 1) / 3. Pipelining on, as users run over SSH.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
prefix=${BATCHQ_HOST_PREFIX:-batchq}-bench-deploy
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_COLLECTIONS_PATH=${BATCHQ_COLLECTIONS_PATH:-$PWD/.cache/collections}
# sudo, as users escalate (su cannot pipeline: each module run would cost five round trips).
export ANSIBLE_PIPELINING=true ANSIBLE_PYTHON_INTERPRETER=auto_silent ANSIBLE_BECOME_METHOD=sudo
work=$(mktemp -d)
hosts=("$prefix"1 "$prefix"2 "$prefix"3 "$prefix"4)
trap 'docker rm -f "${hosts[@]}" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

for host in "${hosts[@]}"; do
  tools/systemd-container.sh "$host" "${BATCHQ_IMAGE_DEBIAN12:-batchq/debian:bookworm}" &
done
wait
inventory() {  # HOST...: an inventory of these hosts in group consumers
  echo "consumers:"
  echo "  hosts:"
  for host in "$@"; do printf '    %s: {ansible_connection: community.docker.docker}\n' "$host"; done
}
inventory "${hosts[0]}" >"$work/one.yml"
inventory "${hosts[@]}" >"$work/four.yml"
{
  echo "consumer_defaults: {interval: 1h, start_delay: 1h}"
  echo "consumer_list:"
  for i in $(seq -w 1 50); do
    echo "  - {name: bench$i, command: /bin/true}"
  done
  # one drain, so that its runner and continuation unit are deployed too
  echo "  - {name: drainer, command: /bin/true, backlog_exit_code: 75}"
} >"$work/consumers.yml"
deploy() {  # INVENTORY [ARGUMENTS...]
  ansible-playbook -i "$1" batchq.consumers.deploy_consumers -e @"$work/consumers.yml" "${@:2}"
}
deploy "$work/four.yml" >"$work/first.log" || { tail -40 "$work/first.log" >&2; exit 1; }

# A no-change re-deploy, counted; it must report no change.
deploy "$work/one.yml" -vvv >"$work/counted.log"
grep -q "changed=0 " "$work/counted.log" || { echo "the re-deploy changed something:" >&2; tail -20 "$work/counted.log" >&2; exit 1; }
[ -z "${BATCHQ_BENCH_LOG:-}" ] || cp "$work/counted.log" "$BATCHQ_BENCH_LOG"
runs=$(grep -c "^<${hosts[0]}> EXEC " "$work/counted.log")
echo "remote runs per host (module runs and Ansible's interpreter discovery) for a no-change re-deploy of 51 consumers: $runs"

measure() {  # INVENTORY: prints "WALL CPU" of a no-change re-deploy, in seconds
  local TIMEFORMAT='%R %U %S'
  { time deploy "$1" >/dev/null; } 2>&1 | awk '{printf "%.2f %.2f\n", $1, $2 + $3}'
}
for round in $(seq "$rounds"); do
  read -r wall1 cpu1 < <(measure "$work/one.yml")
  read -r wall4 cpu4 < <(measure "$work/four.yml")
  echo "round $round: 1 host ${wall1}s wall, ${cpu1}s CPU; 4 hosts ${wall4}s wall, ${cpu4}s CPU"
  echo "$wall1 $cpu1 $wall4 $cpu4" >>"$work/rounds"
done
python3 - "$work/rounds" <<'PY'
import statistics, sys
wall1, cpu1, wall4, cpu4 = (statistics.median(column) for column in
                            zip(*(map(float, line.split()) for line in open(sys.argv[1]))))
print("median: 1 host %.2fs wall, %.2fs CPU; 4 hosts %.2fs wall (%.2fx of one), %.2fs CPU" % (
    wall1, cpu1, wall4, wall4 / wall1, cpu4))
print("controller CPU per host: %.2fs on 1 host, %.2fs on 4 hosts; per extra host %.2fs" % (
    cpu1, cpu4 / 4, (cpu4 - cpu1) / 3))
PY
