#!/usr/bin/env bash
# Times consumer_info on one Debian 12 host with 50 consumers and history: 20.
# Usage: make collection images && benchmarks/consumer_info.sh [ROUNDS]
# Prints the seconds of the consumer_info task (module run and transfer, as
# ansible's profile_tasks measures it) for each round, and their median; then
# the module's own time on the host (its AnsiballZ file run by the host's python3).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
host=${BATCHQ_HOST_PREFIX:-batchq}-bench
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_COLLECTIONS_PATH=${BATCHQ_COLLECTIONS_PATH:-$PWD/.cache/collections}
export ANSIBLE_PIPELINING=true ANSIBLE_PYTHON_INTERPRETER=auto_silent
# The deploy playbook escalates; the image has no sudo, and su from root needs no password.
export ANSIBLE_BECOME_METHOD=su
work=$(mktemp -d)
trap 'docker rm -f "$host" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

tools/systemd-container.sh "$host" "${BATCHQ_IMAGE_DEBIAN12:-batchq/debian:bookworm}"

printf 'consumers:\n  hosts:\n    %s:\n      ansible_connection: community.docker.docker\n' "$host" >"$work/inventory.yml"
{
  echo "consumer_defaults: {interval: 1s, accuracy: 100ms, start_delay: 1s}"
  echo "consumer_list:"
  for i in $(seq -w 1 50); do
    echo "  - {name: bench$i, command: '/bin/sh -c \"echo batch \$\$INVOCATION_ID; echo done\"'}"
  done
} >"$work/consumers.yml"
ansible-playbook -i "$work/inventory.yml" batchq.consumers.deploy_consumers -e @"$work/consumers.yml" >/dev/null
# Every consumer needs 21 finished runs for a full history of 20.
echo "waiting for 21 runs of every consumer..."
for _ in $(seq 120); do
  fewest=$(docker exec "$host" sh -c 'for i in $(seq -w 1 50); do journalctl -q -o cat -u batchq-bench$i.service MESSAGE_ID=39f53479d3a045ac8e11786248231fbf | wc -l; done | sort -n | head -1')
  [ "$fewest" -ge 21 ] && break
  sleep 2
done
# Stop the timers so every round reads the same journal.
docker exec "$host" sh -c 'systemctl stop "batchq-*.timer"'

cat >"$work/bench.yml" <<'PLAY'
- hosts: consumers
  gather_facts: false
  tasks:
    - batchq.consumers.consumer_info:
        history: 20
      register: report
    - ansible.builtin.assert:
        that:
          - report.consumers | length == 50
          - report.consumers.values() | map(attribute='history') | map('length') | min == 20
PLAY
times=()
for round in $(seq "$rounds"); do
  seconds=$(ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks ansible-playbook -i "$work/inventory.yml" "$work/bench.yml" \
    | awk '/batchq.consumers.consumer_info -+ [0-9.]+s$/ {sub("s", "", $NF); print $NF}')
  echo "round $round: consumer_info with 50 consumers, history 20: ${seconds}s"
  times+=("$seconds")
done
printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print "median: " a[int((NR+1)/2)] "s over " NR " rounds"}'

# On the host alone: the module as Ansible ships it (AnsiballZ, kept on the
# host), run by the host's python3, without the connection's and controller's share.
ANSIBLE_KEEP_REMOTE_FILES=true ANSIBLE_PIPELINING=false \
  ansible-playbook -i "$work/inventory.yml" "$work/bench.yml" >/dev/null
docker exec -i "$host" python3 - "$rounds" <<'PY'
import glob, statistics, subprocess, sys, time
wrapper = max(glob.glob("/root/.ansible/tmp/ansible-tmp-*/AnsiballZ_consumer_info.py"))
seconds = []
for _ in range(int(sys.argv[1])):
    began = time.monotonic()
    out = subprocess.run([sys.executable, wrapper], stdout=subprocess.PIPE, check=True).stdout
    seconds.append(time.monotonic() - began)
    assert b'"history"' in out and b'"failed": true' not in out, out[:300]
print("on the host: consumer_info (AnsiballZ, python3) median %.2fs over %d runs (%s)"
      % (statistics.median(seconds), len(seconds), " ".join("%.2f" % s for s in seconds)))
PY
