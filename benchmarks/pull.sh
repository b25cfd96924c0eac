#!/usr/bin/env bash
# Pushed or pulled: what a deploy that changes nothing costs, 51 consumers (one a drain) on
# Debian 13 hosts that already have them, pushed from one controller to all hosts at once, or
# pulled by each host with ansible-pull from a git repository of its own (on the host: no network).
# Usage: make collection images && benchmarks/pull.sh [ROUNDS] [HOSTS]
# The hosts get git, Debian's ansible-core (2.19) and the collection as
# molecule/compat/tests/pull_host.py installs them. The controller runs this tree's
# .venv (ansible-core 2.19 too), with pipelining and sudo, as benchmarks/deploy.sh does;
# both install the same tarball. For each round it prints:
# - pushed: the wall time and the controller's CPU (user + system of ansible-playbook and its
#   children), and the CPU that all the hosts' containers used meanwhile (their cgroups);
# - pulled: for each host, one after another, the wall time of its ansible-pull and the CPU its
#   container used (the checkout, ansible-playbook and the modules, all on the host; the
#   controller does nothing).
# Then the medians: the controller's CPU per host when it pushes, and each host's own CPU per run.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
count=${2:-4}
prefix=${BATCHQ_HOST_PREFIX:-batchq}-bench-pull
export PATH=$PWD/.venv/bin:$PATH
export ANSIBLE_PIPELINING=true ANSIBLE_PYTHON_INTERPRETER=auto_silent ANSIBLE_BECOME_METHOD=sudo
work=$(mktemp -d)
hosts=()
for i in $(seq "$count"); do hosts+=("$prefix$i"); done
trap 'docker rm -f "${hosts[@]}" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

tarball=${BATCHQ_TARBALL:-$(ls .cache/build/batchq-consumers-*.tar.gz)}
cp "$tarball" "$work/"
tarball=$work/$(basename "$tarball")
export ANSIBLE_COLLECTIONS_PATH=$work/collections
ansible-galaxy collection install -p "$work/collections" "$tarball" >/dev/null

for host in "${hosts[@]}"; do
  tools/systemd-container.sh "$host" "${BATCHQ_IMAGE_DEBIAN13:-batchq/debian:trixie}" &
done
wait
# One host after another: each installs Debian's packages, which costs CPU of its own.
for host in "${hosts[@]}"; do
  python3 molecule/compat/tests/pull_host.py "$host" "$tarball" .cache/pull >/dev/null
done

consumers() {
  echo "consumer_defaults: {interval: 1h, start_delay: 1h}"
  echo "consumer_list:"
  for i in $(seq -w 1 50); do
    echo "  - {name: bench$i, command: /bin/true}"
  done
  echo "  - {name: drainer, command: /bin/true, backlog_exit_code: 75}"
}
{
  echo "consumers:"
  echo "  hosts:"
  for host in "${hosts[@]}"; do printf '    %s: {ansible_connection: community.docker.docker}\n' "$host"; done
} >"$work/push.yml"
consumers >"$work/consumers.yml"

# The repository each host pulls: the same consumers, the same inventory, run on the host
# itself as root (the AWX guide, "Hosts that deploy themselves").
repo=$work/repo
mkdir -p "$repo/group_vars"
printf -- '---\n- name: Deploy the consumers\n  ansible.builtin.import_playbook: batchq.consumers.deploy_consumers\n' >"$repo/local.yml"
{ echo "consumers:"; echo "  hosts:"; for host in "${hosts[@]}"; do echo "    $host:"; done; } >"$repo/inventory.yml"
{
  echo "ansible_connection: local"
  echo "ansible_become: false"
  echo "ansible_python_interpreter: /usr/bin/python3"
  consumers
} >"$repo/group_vars/consumers.yml"
git -C "$repo" init --quiet --initial-branch=main
git -C "$repo" add --all
git -C "$repo" -c user.name=bench -c user.email=bench@example.invalid commit --quiet --message consumers
for host in "${hosts[@]}"; do
  python3 -c 'import sys; sys.path.insert(0, "molecule/compat/tests"); import pull_host; pull_host.publish(sys.argv[1], sys.argv[2])' \
    "$host" "$repo"
done

push() { ansible-playbook -i "$work/push.yml" batchq.consumers.deploy_consumers -e @"$work/consumers.yml"; }
# On the host, from / as a timer would run it: the CPU of ansible-pull and all its children.
pull() {
  docker exec -w / "$1" python3 -c '
import resource, subprocess, sys, time
began = time.monotonic()
done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
wall = time.monotonic() - began
if done.returncode != 0 or "changed=0 " not in done.stdout:
    sys.exit(done.stdout)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print("%.2f %.2f" % (wall, usage.ru_utime + usage.ru_stime))
' ansible-pull --url /srv/consumers.git --directory /var/lib/batchq-pull --inventory inventory.yml local.yml
}
# The CPU time (s) a container has used, from its cgroup (as benchmarks/fleet.sh reads it).
container_cpu() {
  local id
  id=$(docker inspect -f '{{.Id}}' "$1")
  if [ -r "/sys/fs/cgroup/cpuacct/docker/$id/cpuacct.usage" ]; then
    awk '{printf "%.3f\n", $1 / 1e9}' "/sys/fs/cgroup/cpuacct/docker/$id/cpuacct.usage"
  elif [ -r "/sys/fs/cgroup/system.slice/docker-$id.scope/cpu.stat" ]; then
    awk '$1 == "usage_usec" {printf "%.3f\n", $2 / 1e6}' "/sys/fs/cgroup/system.slice/docker-$id.scope/cpu.stat"
  else
    echo 0
  fi
}
hosts_cpu() { local host; for host in "${hosts[@]}"; do container_cpu "$host"; done | awk '{s += $1} END {printf "%.3f\n", s}'; }

push >"$work/first.log" || { tail -40 "$work/first.log" >&2; exit 1; }
# Each host's first pull checks the repository out: not counted.
for host in "${hosts[@]}"; do pull "$host" >/dev/null; done

for round in $(seq "$rounds"); do
  before=$(hosts_cpu)
  TIMEFORMAT='%R %U %S'
  read -r wall user system < <({ time push >"$work/push.log"; } 2>&1)
  grep -q "changed=0 " "$work/push.log" || { echo "the pushed deploy changed something:" >&2; tail -20 "$work/push.log" >&2; exit 1; }
  on_hosts=$(awk -v a="$(hosts_cpu)" -v b="$before" 'BEGIN {printf "%.2f", a - b}')
  cpu=$(awk -v u="$user" -v s="$system" 'BEGIN {printf "%.2f", u + s}')
  echo "round $round: pushed to $count hosts ${wall}s wall, ${cpu}s controller CPU, ${on_hosts}s CPU on the hosts"
  echo "push $wall $cpu $on_hosts" >>"$work/rounds"
  for host in "${hosts[@]}"; do
    cpu=
    before=$(container_cpu "$host")
    read -r wall cpu < <(pull "$host") || true
    [ -n "${cpu:-}" ] || { echo "the pull on $host failed" >&2; exit 1; }
    on_host=$(awk -v a="$(container_cpu "$host")" -v b="$before" 'BEGIN {printf "%.2f", a - b}')
    echo "round $round: $host pulled ${wall}s wall, ${cpu}s CPU of ansible-pull, ${on_host}s CPU of its container"
    echo "pull $wall $cpu $on_host" >>"$work/rounds"
  done
done
python3 - "$work/rounds" "$count" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
count = int(sys.argv[2])
push = [list(map(float, row[1:])) for row in rows if row[0] == "push"]
pull = [list(map(float, row[1:])) for row in rows if row[0] == "pull"]
median = lambda values: statistics.median(values)
wall, cpu, hosts = (median(column) for column in zip(*push))
print("pushed to %d hosts, median of %d rounds: %.2fs wall, %.2fs controller CPU (%.2fs a host), "
      "%.2fs CPU on the hosts (%.2fs a host)" % (count, len(push), wall, cpu, cpu / count, hosts, hosts / count))
wall, cpu, container = (median(column) for column in zip(*pull))
low, high = min(row[2] for row in pull), max(row[2] for row in pull)
print("pulled, median of %d runs (%d hosts, %d rounds): %.2fs wall, %.2fs CPU of ansible-pull, "
      "%.2fs CPU of the host's container (%.2f-%.2fs); the controller's CPU: none" % (
          len(pull), count, len(push), wall, cpu, container, low, high))
PY
