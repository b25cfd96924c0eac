#!/usr/bin/env bash
# Instances as a range against fixed counts (issue 42), on one PostgreSQL
# queue and three workers (benchmarks/pg_fleet.sh), with the reference
# consumer examples/postgresql_queue/batchq-pgqueue (batches of 100 jobs of
# 2 ms, interval 10s):
#   1. A backlog of ELASTIC_JOBS jobs (default 20000), drained by
#      {min: 1, max: 4, cooldown: 10s} on each worker, and by a fixed 4 on
#      each. Each drain starts when the workers start their instances' timers
#      (the range: instance 1; the fixed count: all 4), and ends with the last
#      job marked done (the database's clock). Prints the seconds of each and
#      their ratio (goal: at most 1.15). From the range's drains: how many
#      batches of backlog instance 1 had ended when instance 2 started (goal:
#      2), and how long after the last job every worker was back to 1
#      instance (goal: within the interval).
#   2. An empty queue for ELASTIC_IDLE_SECONDS (default 600): the runs of the
#      range against the runs of a fixed 1 instance, both scheduled over the
#      same time (goal: at most 1.1 times).
# Usage: make collection images && benchmarks/elastic.sh [ROUNDS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
jobs=${ELASTIC_JOBS:-20000}
idle=${ELASTIC_IDLE_SECONDS:-600}
interval=10
# the hosts: $database and $workers, their inventory in $work (benchmarks/pg_fleet.sh)
# shellcheck source=benchmarks/pg_fleet.sh
source benchmarks/pg_fleet.sh elastic
# Paused: the units are there, nothing starts them but this script.
cat >"$work/vars.yml" <<EOF
pgqueue_password: $password
consumer_defaults:
  command: /usr/local/bin/batchq-pgqueue --limit 100 --work-ms 2
  backlog_exit_code: 75
  interval: ${interval}s
  start_delay: 0
  state: paused
  environment: {PGHOST: $database, PGDATABASE: batchq, PGUSER: batchq}
  credentials: {pgpassword: "{{ pgqueue_password }}"}
consumer_list:
  - {name: pgrange, instances: {min: 1, max: 4, cooldown: 10s}}
  - {name: pgfixed, instances: 4}
  - {name: pgone}
EOF
ansible-playbook -i "$work/inventory.yml" -e @"$work/vars.yml" examples/postgresql_queue/database.yml >/dev/null
ansible-playbook -i "$work/inventory.yml" -e @"$work/vars.yml" examples/postgresql_queue/deploy.yml >/dev/null

on_workers() { local w; for w in "${workers[@]}"; do docker exec "$w" sh -c "$1"; done; }
now() { date +%s.%N; }
# the realtime seconds of journal entries (one per line) matching journalctl's arguments, on a worker
journal_times() {
  docker exec "$1" journalctl --no-pager -o json "${@:2}" | python3 -c '
import json, sys
for line in sys.stdin:
    print(int(json.loads(line)["__REALTIME_TIMESTAMP"]) / 1e6)'
}

# One drain of $jobs by a variant (pgrange or pgfixed); prints its seconds.
drain() {
  local variant=$1 count=4 started w
  sql "TRUNCATE batchq_results, batchq_jobs RESTART IDENTITY" >/dev/null
  docker exec -e PGHOST="$database" -e PGDATABASE=batchq -e PGUSER=batchq -e PGPASSWORD="$password" \
    "${workers[0]}" batchq-pgqueue-enqueue "$jobs" >/dev/null
  sql "CHECKPOINT" >/dev/null
  [ "$variant" = pgfixed ] || count=1
  started=$(sql "SELECT extract(epoch FROM clock_timestamp())")
  # a timer never triggered since boot elapses at once when started (OnBootSec= is past)
  for w in "${workers[@]}"; do
    docker exec "$w" systemctl start $(seq -f "batchq-$variant@%g.timer" 1 "$count")
  done
  until [ "$(sql "SELECT count(*) FROM batchq_jobs WHERE state <> 'done'")" = 0 ]; do sleep 0.5; done
  sql "SELECT round(extract(epoch FROM max(done_at)) - $started, 1) FROM batchq_jobs"
}

# After a drain of the range: the seconds from the last job to every worker back
# to 1 instance, and what instance 1 had ended when instance 2 started on each worker.
range_after() {
  local last w up
  last=$(sql "SELECT extract(epoch FROM max(done_at)) FROM batchq_jobs")
  for w in "${workers[@]}"; do
    # is-active says one state a line, "inactive" for a unit never loaded
    docker exec "$w" sh -c 'while systemctl is-active batchq-pgrange@2.timer batchq-pgrange@3.timer batchq-pgrange@4.timer \
                                   | grep -qvx inactive; do sleep 0.2; done'
  done
  up=$(now)
  echo "back to 1 instance on every worker $(awk -v a="$up" -v b="$last" 'BEGIN {printf "%.1f", a - b}') s after the last job (interval ${interval} s)"
  for w in "${workers[@]}"; do
    docker exec "$w" python3 -c '
import json, subprocess
def entries(*args):
    out = subprocess.run(["journalctl", "--no-pager", "-o", "json"] + list(args), capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]
starts = [int(e["__REALTIME_TIMESTAMP"]) for e in entries("-u", "batchq-pgrange@2.service", "MESSAGE_ID=7d4958e842da4a758f6c1cdc7b36dcc5")]
ends = [(int(e["BATCHQ_ENDED_USEC"]), e["BATCHQ_RESULT"]) for e in entries("-u", "batchq-pgrange@1.service", "MESSAGE_ID=4f3c5a1e9b6d4c0e8a2f7b9d1e3c5a70")]
if starts:
    before = [result for ended, result in ends if ended <= starts[0]]
    tail = 0
    for result in reversed(before):
        if result != "backlog":
            break
        tail += 1
    print("  instance 2 started after instance 1 ended %d batches of backlog in a row" % tail)'
  done
  on_workers 'journalctl --rotate >/dev/null; journalctl --vacuum-time=1s >/dev/null 2>&1'
}

declare -A seconds
for ((round = 1; round <= rounds; round++)); do
  for variant in pgrange pgfixed; do
    seconds[$variant]+="$(drain "$variant") "
    [ "$variant" = pgfixed ] || range_after >&2
    on_workers "systemctl stop 'batchq-$variant@*.timer'; while systemctl list-units --plain --no-legend --state=active,activating,deactivating 'batchq-$variant@*.service' | grep -q .; do sleep 0.2; done"
  done
  echo "round $round: {min 1, max 4} ${seconds[pgrange]}s / fixed 4 ${seconds[pgfixed]}s" >&2
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
r=$(median <<<"${seconds[pgrange]}") f=$(median <<<"${seconds[pgfixed]}")
echo "$jobs jobs on 3 workers, median of $rounds rounds: {min 1, max 4} $r s, fixed 4 $f s, ratio $(awk -v r="$r" -v f="$f" 'BEGIN {printf "%.2f", r / f}')"

# An empty queue: both scheduled for $idle seconds, side by side.
sql "TRUNCATE batchq_results, batchq_jobs RESTART IDENTITY" >/dev/null
since=$(date +%s)
on_workers "systemctl start batchq-pgrange@1.timer batchq-pgone.timer"
sleep "$idle"
on_workers "systemctl stop batchq-pgrange@1.timer batchq-pgone.timer"
ranged=0 one=0
for w in "${workers[@]}"; do
  ranged=$((ranged + $(journal_times "$w" -u 'batchq-pgrange@*.service' MESSAGE_ID=7d4958e842da4a758f6c1cdc7b36dcc5 --since "@$since" | wc -l)))
  one=$((one + $(journal_times "$w" -u batchq-pgone.service MESSAGE_ID=7d4958e842da4a758f6c1cdc7b36dcc5 --since "@$since" | wc -l)))
done
echo "empty queue for $idle s on 3 workers: {min 1, max 4} $ranged runs, fixed 1 $one runs, ratio $(awk -v r="$ranged" -v o="$one" 'BEGIN {printf "%.2f", r / o}')"
