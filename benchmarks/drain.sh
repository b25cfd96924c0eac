#!/usr/bin/env bash
# Drains a local queue four ways on one Debian 12 and one Debian 13 container
# and prints what running each batch as a fresh process costs (issue 8).
# Usage: make collection && benchmarks/drain.sh [ROUNDS]    (ROUNDS >= 3, default 3)
# Environment: DRAIN_ITEMS (N, default 10000), DRAIN_BATCHES (default "10 100 1000"),
# DRAIN_VARIANTS (default "a b c w p n d"), DRAIN_IMPORT_SECONDS (how long the
# Python consumer's import takes, default 0: its standard library only),
# BATCHQ_IMAGE_DEBIAN12, BATCHQ_IMAGE_DEBIAN13, BENCH_PLOT_DIR (below).
#
# The last table (ms a batch beyond its work after the run's first batch, by B)
# is also drawn (benchmarks/plot.py, matplotlib of the docs venv, which `make`
# installs) as BENCH_PLOT_DIR/drain-VARIANTS.png (e.g. drain-acpn.png for
# DRAIN_VARIANTS="a c p n"); BENCH_PLOT_DIR defaults to docs/docsite/rst/images,
# the performance guide's pictures, and an empty BENCH_PLOT_DIR draws nothing.
#
# A queue of N items, 1 ms of busy CPU per item (benchmarks/drain/consumer.c,
# a static C program: its own start is measured and printed), batch size B:
#   (a) a consumer deployed by the role with backlog_exit_code: 75, interval 1h:
#       one blocking `systemctl start`, batchq-drain runs batch after batch;
#   (b) a Type=simple service with the same sandbox (its lines copied from the
#       unit the role rendered for (a)) running the same batch loop in one
#       process, `consumer --loop`; it ends at the empty queue to be timed;
#   (c) the consumer in a shell loop as root, no systemd: the floor for a
#       fresh process per batch;
#   (w) batchq-drain run by hand as root, no unit: the wrapper's own share;
#   (p) (a) with the same consumer in Python (benchmarks/drain/consumer.py)
#       and preload: each batch a fork of the runner that imported it once;
#   (n) (p) without preload: a fresh interpreter and its imports per batch;
#   (d) today's behaviour: the role's consumer without backlog_exit_code,
#       interval 1s, the role's default accuracy (1s). A full drain would take
#       N/B times (B ms + about 2 s), so the figure comes from 5 batches per
#       round (the consumer's own timestamps) and the drain time is that rate
#       extrapolated to N items.
# Rounds interleave the variants (a b c w per B per round), so slow changes of
# the machine's load fall on all of them alike; ratios pair variants within a
# round. Run it on a quiet machine: the work is busy CPU on one core and the
# machine has two.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
[ "$rounds" -ge 3 ] || { echo "drain.sh: at least 3 rounds" >&2; exit 2; }
items=${DRAIN_ITEMS:-10000}
read -r -a batches <<<"${DRAIN_BATCHES:-10 100 1000}"
read -r -a variants <<<"${DRAIN_VARIANTS:-a b c w p n d}"
import_seconds=${DRAIN_IMPORT_SECONDS:-0}
wants() { [[ " ${variants[*]} " == *" $1 "* ]]; }
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/.cache/collections
export ANSIBLE_PIPELINING=true ANSIBLE_PYTHON_INTERPRETER=auto_silent
# The deploy playbook escalates; the image has no sudo, and su from root needs no password.
export ANSIBLE_BECOME_METHOD=su
work=$(mktemp -d)
containers=(batchq-bench-drain-12 batchq-bench-drain-13)
trap 'echo "drain.sh: failed at line $LINENO" >&2' ERR
trap 'docker rm -f "${containers[@]}" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# Static: one execve, no dynamic loader, and it runs on both Debian releases.
gcc -O2 -static -Wall -Wextra -Werror -o "$work/consumer" benchmarks/drain/consumer.c
role=$ANSIBLE_COLLECTIONS_PATH/ansible_collections/batchq/consumers/roles/consumer
if grep -q backlog_exit_code "$role/meta/argument_specs.yml"; then
  drain_mode=true
else
  drain_mode=false
  echo "the installed collection has no backlog_exit_code: (a) is left out"
fi
if ! grep -q 'C(preload)' "$role/meta/argument_specs.yml"; then
  variants=("${variants[@]/p/}") && variants=("${variants[@]/n/}")
  echo "the installed collection has no preload: (p) and (n) are left out"
fi

# The Python consumer and what its runner imports once with preload.
pyconsumer=/usr/local/lib/drain-bench/consumer.py
pypreload=fcntl
[ "$import_seconds" = 0 ] || pypreload+=", slowimport"
# Runs a command in the container being measured.
inside() { docker exec "$host" "$@"; }

deploy() {
  local b
  printf 'consumers:\n  hosts:\n    %s:\n      ansible_connection: community.docker.docker\n' "$host" >"$work/inventory.yml"
  {
    echo "consumer_list:"
    for b in "${batches[@]}"; do
      # start_delay 1s: the first run (empty queue) is over before the first round.
      echo "  - {name: bench-$b, command: '/usr/local/bin/drain-consumer /srv/drain/$b $b', interval: 1h,"
      echo "     start_delay: 1s, writable_paths: [/srv/drain/$b]$($drain_mode && echo ', backlog_exit_code: 75')}"
      # Paused: its timer is started by hand for (d) only, so that it runs no
      # batch while the others are timed.
      echo "  - {name: tick-$b, command: '/usr/local/bin/drain-consumer /srv/drain/tick-$b $b', interval: 1s,"
      echo "     state: paused, writable_paths: [/srv/drain/tick-$b]}"
      # (p) and (n): the Python consumer, with and without preload
      wants p || wants n || continue
      echo "  - {name: py-$b, command: '$pyconsumer /srv/drain/py-$b $b', interval: 1h, start_delay: 1s,"
      echo "     writable_paths: [/srv/drain/py-$b], backlog_exit_code: 75, preload: [$pypreload],"
      echo "     environment: {BENCH_IMPORT_SECONDS: '$import_seconds'}}"
      echo "  - {name: pyfresh-$b, command: '$pyconsumer /srv/drain/pyfresh-$b $b', interval: 1h, start_delay: 1s,"
      echo "     writable_paths: [/srv/drain/pyfresh-$b], backlog_exit_code: 75,"
      echo "     environment: {BENCH_IMPORT_SECONDS: '$import_seconds'}}"
    done
  } >"$work/consumers.yml"
  ansible-playbook -i "$work/inventory.yml" batchq.consumers.deploy_consumers -e @"$work/consumers.yml" >"$work/deploy.log" \
    || { cat "$work/deploy.log"; return 1; }
}

# (b): the rendered unit of bench-B with the daemon's lines in place of the
# oneshot's, so that every sandbox line is the role's, not a copy from memory;
# the line of the drain mode (the hand-over to the next activation) goes. Prints the difference.
daemon_units() {
  local b
  for b in "${batches[@]}"; do
    inside cat "/etc/systemd/system/batchq-bench-$b.service" | sed \
      -e "s|^Description=.*|Description=drain benchmark daemon, batch $b|" \
      -e 's|^Type=oneshot$|Type=simple|' \
      -e "s|^ExecStart=.*|ExecStart=/usr/local/bin/drain-consumer --loop /srv/drain/$b $b|" \
      -e '/^OnSuccess=/d' >"$work/bench-daemon-$b.service"
    docker cp -q "$work/bench-daemon-$b.service" "$host:/etc/systemd/system/"
  done
  inside systemctl daemon-reload
  b=${batches[0]}
  echo "(b)'s unit against the role's for (a), B = $b (< role, > daemon):"
  inside cat "/etc/systemd/system/batchq-bench-$b.service" | { diff - "$work/bench-daemon-$b.service" || true; } | sed -n 's/^[<>]/  &/p'
}

# Mean time in ms of one run of a command from a bash loop (fork, exec, run, wait).
start_cost() {
  local runs=$1; shift
  inside bash -c "t=\$EPOCHREALTIME; for ((i = 0; i < $runs; i++)); do $*; done; echo \$t \$EPOCHREALTIME" \
    | awk -v runs="$runs" '{printf "%.3f", ($2 - $1) * 1000 / runs}'
}

run_distro() {
  local release=$1 image=$2 b round variant result wrapper=""
  host=batchq-bench-drain-$release
  echo "== Debian $release ($image): N = $items, B in ${batches[*]}, $rounds rounds"
  printf '%s\tload\t%s\n' "$release" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$work/starts"
  tools/systemd-container.sh "$host" "$image"
  docker cp -q "$work/consumer" "$host:/usr/local/bin/drain-consumer"
  docker cp -q benchmarks/drain/drain-once.sh "$host:/usr/local/bin/drain-once"
  inside mkdir -p "${pyconsumer%/*}"
  docker cp -q benchmarks/drain/consumer.py "$host:$pyconsumer"
  docker cp -q benchmarks/drain/slowimport.py "$host:${pyconsumer%/*}/slowimport.py"
  for b in "${batches[@]}"; do
    # World-writable: the batches run as the role's account (batchq) under
    # PrivateUsers=, (c) and (w) as root.
    inside sh -c "for d in /srv/drain/$b /srv/drain/tick-$b /srv/drain/py-$b /srv/drain/pyfresh-$b; do
      mkdir -p \$d && chmod 0777 \$d && echo 0 >\$d/items && : >\$d/batches.log && chmod 0666 \$d/items \$d/batches.log; done"
  done
  deploy
  daemon_units
  if $drain_mode; then
    wrapper=$(inside sed -n '/^ExecStart=/s|.* "\{0,1\}\(/[^ "]*batchq-drain\).*|\1|p' "/etc/systemd/system/batchq-bench-${batches[0]}.service")
  else
    wrapper=/usr/local/lib/drain-bench/batchq-drain
    inside mkdir -p "${wrapper%/*}"
    # the runner, its modules and the run protocol, as the role lays them out
    for file in roles/consumer/files/batchq-drain roles/consumer/files/batchq_*.py roles/consumer/files/consumer_protocol.py; do
      docker cp -q -L "$file" "$host:${wrapper%/*}/${file##*/}"
    done
  fi
  # (w)'s runtime spec: batches back to back while they exit 75, no timeout, no metrics
  docker exec -i "$host" sh -c "cat >${wrapper%/*}/bench-w.json" <<'JSON'
{"spec_version": 1, "consumer": "bench-w", "services": ["bench-w.service"], "backlog_exit_code": 75,
 "timeout_usec": 0, "stop_timeout_usec": 0, "interval_usec": 1000000, "preload": [], "metrics_folder": null,
 "hooks": null, "hook_credentials": null, "running_max": null}
JSON
  # Let the first, empty runs of the bench-* consumers pass.
  sleep 2
  while inside sh -c 'systemctl list-units --state=activating --plain --no-legend "batchq-*" | grep -q .'; do sleep 1; done

  inside sh -c "echo 0 >/srv/drain/${batches[0]}/items"
  {
    printf '%s\tversions\tsystemd %s, %s\n' "$release" \
      "$(inside sh -c 'systemctl --version | sed -n "1s/[^0-9]*\([0-9]*\).*/\1/p"')" "$(inside python3 -V)"
    printf '%s\tstart\t%s\t%s\n' "$release" consumer \
      "$(start_cost 1000 "/usr/local/bin/drain-consumer /srv/drain/${batches[0]} ${batches[0]} >/dev/null")"
    printf '%s\tstart\t%s\t%s\n' "$release" /bin/true "$(start_cost 1000 /bin/true)"
    printf '%s\tstart\t%s\t%s\n' "$release" "python3 -I batchq-drain" "$(start_cost 100 "python3 -I $wrapper 2>/dev/null")"
  } >>"$work/starts"

  for round in $(seq "$rounds"); do
    for b in "${batches[@]}"; do
      for variant in a b c w p n; do
        wants "$variant" || continue
        [ "$variant" = a ] && ! $drain_mode && continue
        result=$(inside drain-once "$variant" "$b" "$items" "$wrapper")
        echo "$release $variant $b $round $result" | tee -a "$work/results" \
          | awk '{printf "  %s B=%s round %s: %.2fs, %s batches\n", $2, $3, $4, $5, $6}'
      done
    done
  done

  # (d): 5 batches per round, one run of the timer, batch starts from the log.
  for b in "${batches[@]}"; do
    wants d || continue
    inside sh -c "echo $(((rounds * 5 + 2) * b)) >/srv/drain/tick-$b/items; : >/srv/drain/tick-$b/batches.log"
    inside systemctl start "batchq-tick-$b.timer"
    for _ in $(seq $((rounds * 5 * (b / 1000 + 3) + 30))); do
      [ "$(inside sh -c "wc -l </srv/drain/tick-$b/batches.log")" -gt $((rounds * 5)) ] && break
      sleep 1
    done
    inside systemctl stop "batchq-tick-$b.timer"
    inside cat "/srv/drain/tick-$b/batches.log" | awk -v release="$release" -v b="$b" -v rounds="$rounds" '
      {start[NR] = $1}
      END {
        if (NR <= rounds * 5) { print "drain.sh: (d) B=" b ": only " NR " batches" > "/dev/stderr"; exit 1 }
        for (r = 0; r < rounds; r++)
          printf "%s d %s %d %.6f 5 %d\n", release, b, r + 1, (start[r * 5 + 6] - start[r * 5 + 1]) / 1e9, 5 * b
      }' | tee -a "$work/results" | awk '{printf "  d B=%s round %s: %.2fs for 5 batches\n", $3, $4, $5}'
  done
  printf '%s\tload\t%s\n' "$release" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$work/starts"
  docker rm -f "$host" >/dev/null
}

# In a function, read whole before it runs: editing this file during a run is safe.
main() {
  run_distro 12 "${BATCHQ_IMAGE_DEBIAN12:-batchq/debian:bookworm}"
  run_distro 13 "${BATCHQ_IMAGE_DEBIAN13:-batchq/debian:trixie}"
  echo
  python3 benchmarks/drain/table.py "$work/starts" "$work/results" "$items" | tee "$work/table"
  local plot_dir=${BENCH_PLOT_DIR-docs/docsite/rst/images} name
  if [ -n "$plot_dir" ]; then
    name=$(printf '%s' "${variants[@]}")
    make -s "$PWD/.cache/docs-venv/.installed"
    mkdir -p "$plot_dir"
    .cache/docs-venv/bin/python benchmarks/plot.py drain "$work/table" "$plot_dir/drain-$name.png" \
      "A drain's cost per batch, $items items"
  fi
}
main
exit
