#!/usr/bin/env bash
# One PostgreSQL backlog drained by 1, 2, 4 and 6 consumer instances spread over
# three workers, against as many long-lived workers running the same claim loop
# (issue 9). Prints jobs/s for each and the ratio.
# Usage: make collection images && benchmarks/fleet.sh [ROUNDS]   (default 3)
# Environment: FLEET_JOBS (default 10000), FLEET_WORK_MS (default 2), FLEET_LIMIT
# (batch size, default 100), FLEET_COUNTS (instances, default "1 2 4 6"),
# BATCHQ_HOST_PREFIX (container names, default batchq), BENCH_PLOT_DIR (below).
#
# The table is also drawn (benchmarks/plot.py, matplotlib of the docs venv,
# which `make` installs) as BENCH_PLOT_DIR/fleet-batchLIMIT.png: throughput
# against instances, and each setup's share of the daemons with the target of
# 0.9; BENCH_PLOT_DIR defaults to docs/docsite/rst/images, the
# performance guide's pictures, and an empty BENCH_PLOT_DIR draws nothing.
#
# Hosts: one PostgreSQL host (Debian's postgresql, examples/postgresql_queue/
# database.yml) and three workers (two Debian 12, one Debian 13) on a network of
# their own. Every variant runs examples/postgresql_queue/batchq-pgqueue:
#   consumer: the role's units (backlog_exit_code: 75, default sandbox), one
#             `systemctl start` per instance; batchq-drain runs batch after
#             batch, each a fresh process with a fresh connection;
#   preload:  the same with preload: [psycopg, argparse, hashlib, resource]
#             (the modules it imports that psycopg does not): each batch a fork of the
#             runner that imported psycopg once, with a fresh connection;
#   pooled:   the same through a local PgBouncer on each worker (examples/
#             postgresql_queue/pooler.yml): each batch connects to its socket,
#             and gets a server connection an earlier batch opened;
#   daemon:   `batchq-pgqueue --loop` in a transient service (systemd-run, no
#             sandbox): one process and one connection for the whole drain.
# Each run ends when a batch leaves no due job behind; its drain time is
# from the start (the database's clock) to the last job marked done
# (clock_timestamp() of its UPDATE). Rounds interleave the variants. A second
# table gives the CPU time a batch (LIMIT jobs) cost the three workers together
# and the database, from their containers' cgroups over each drain.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
jobs=${FLEET_JOBS:-10000}
work_ms=${FLEET_WORK_MS:-2}
limit=${FLEET_LIMIT:-100}
# the hosts: $database and $workers, their inventory in $work (benchmarks/pg_fleet.sh)
# shellcheck source=benchmarks/pg_fleet.sh
source benchmarks/pg_fleet.sh fleet
# Paused: the units are there, nothing starts them but this script.
cat >"$work/vars.yml" <<EOF
pgqueue_password: $password
consumer_list:
  - name: pgqueue
    command: /usr/local/bin/batchq-pgqueue --limit $limit --work-ms $work_ms
    backlog_exit_code: 75
    instances: 2
    state: paused
    environment: {PGHOST: $database, PGDATABASE: batchq, PGUSER: batchq}
    credentials: {pgpassword: "{{ pgqueue_password }}"}
  - name: pgpreload
    command: /usr/local/bin/batchq-pgqueue --limit $limit --work-ms $work_ms
    backlog_exit_code: 75
    preload: [psycopg, argparse, hashlib, resource]
    instances: 2
    state: paused
    environment: {PGHOST: $database, PGDATABASE: batchq, PGUSER: batchq}
    credentials: {pgpassword: "{{ pgqueue_password }}"}
  - name: pgpooled
    command: /usr/local/bin/batchq-pgqueue --limit $limit --work-ms $work_ms
    backlog_exit_code: 75
    preload: [psycopg, argparse, hashlib, resource]
    instances: 2
    state: paused
    environment: {PGHOST: /var/run/postgresql, PGPORT: "6432", PGDATABASE: batchq, PGUSER: batchq}
EOF
ansible-playbook -i "$work/inventory.yml" -e @"$work/vars.yml" examples/postgresql_queue/database.yml >/dev/null
ansible-playbook -i "$work/inventory.yml" -e @"$work/vars.yml" examples/postgresql_queue/pooler.yml >/dev/null
ansible-playbook -i "$work/inventory.yml" -e @"$work/vars.yml" examples/postgresql_queue/deploy.yml >/dev/null

# The CPU time (ns) a container has used, from its cgroup: cgroup v1 (cgroupfs)
# or v2 (systemd's scopes); 0 where neither is found.
container_cpu() {
  local id
  id=$(docker inspect -f '{{.Id}}' "$1")
  if [ -r "/sys/fs/cgroup/cpuacct/docker/$id/cpuacct.usage" ]; then
    cat "/sys/fs/cgroup/cpuacct/docker/$id/cpuacct.usage"
  elif [ -r "/sys/fs/cgroup/system.slice/docker-$id.scope/cpu.stat" ]; then
    awk '$1 == "usage_usec" {print $2 * 1000}' "/sys/fs/cgroup/system.slice/docker-$id.scope/cpu.stat"
  else
    echo 0
  fi
}
workers_cpu() { local total=0 host; for host in "${workers[@]}"; do total=$((total + $(container_cpu "$host"))); done; echo $total; }

# What a batch pays before its first job, beside its work: a connection as the
# consumer makes it (libpq's defaults: TLS when the server offers it, SCRAM),
# a fork of a process that has imported psycopg, and a connection through the
# local PgBouncer; means of 50, on one worker.
docker exec -e PGHOST="$database" -e PGDATABASE=batchq -e PGUSER=batchq -e PGPASSWORD="$password" \
  "${workers[0]}" python3 -c '
import os, time, psycopg
connection = psycopg.connect()
tls = connection.pgconn.ssl_in_use
connection.close()
began = time.perf_counter()
for _ in range(50):
    psycopg.connect().close()
connect = (time.perf_counter() - began) / 50
began = time.perf_counter()
for _ in range(50):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
fork = (time.perf_counter() - began) / 50
print("a connection (%s, SCRAM): %.1f ms; a fork of a process with psycopg imported: %.1f ms"
      % ("TLS" if tls else "no TLS", connect * 1000, fork * 1000))'
# the same connection through the worker's PgBouncer, as the consumer's account
docker exec -u batchq -e PGHOST=/var/run/postgresql -e PGPORT=6432 -e PGDATABASE=batchq -e PGUSER=batchq \
  "${workers[0]}" python3 -c '
import time, psycopg
psycopg.connect().close()
began = time.perf_counter()
for _ in range(50):
    psycopg.connect().close()
print("a connection through the local PgBouncer: %.2f ms" % ((time.perf_counter() - began) / 50 * 1000))'

# The instances of a run of N: spread over the workers, worker by worker.
placement() {
  local n=$1 k
  for ((k = 0; k < n; k++)); do echo "$((k % 3)) $((k / 3 + 1))"; done
}

# One drain by N instances of a variant; prints its jobs/s, then the workers'
# and the database's CPU ms per batch of $limit jobs.
drain() {
  local variant=$1 n=$2 w i started workers_before database_before workers_used database_used
  sql "TRUNCATE batchq_results, batchq_jobs RESTART IDENTITY" >/dev/null
  docker exec -e PGHOST="$database" -e PGDATABASE=batchq -e PGUSER=batchq -e PGPASSWORD="$password" \
    "${workers[0]}" batchq-pgqueue-enqueue "$jobs" >/dev/null
  # every drain starts from the same database: what came before flushed, no checkpoint under way
  sql "CHECKPOINT" >/dev/null
  workers_before=$(workers_cpu) database_before=$(container_cpu "$database")
  started=$(sql "SELECT extract(epoch FROM clock_timestamp())")
  while read -r w i; do
    if [ "$variant" = consumer ]; then
      docker exec "${workers[$w]}" systemctl start --no-block "batchq-pgqueue@$i.service"
    elif [ "$variant" = preload ]; then
      docker exec "${workers[$w]}" systemctl start --no-block "batchq-pgpreload@$i.service"
    elif [ "$variant" = pooled ]; then
      docker exec "${workers[$w]}" systemctl start --no-block "batchq-pgpooled@$i.service"
    else
      docker exec "${workers[$w]}" systemd-run --quiet --collect --unit="bench-daemon-$i" \
        -E PGHOST="$database" -E PGDATABASE=batchq -E PGUSER=batchq -E PGPASSWORD="$password" \
        /usr/bin/python3 /usr/local/bin/batchq-pgqueue --loop --limit "$limit" --work-ms "$work_ms"
    fi
  done < <(placement "$n")
  # every unit of the run has ended (waited for inside each worker, not polled from here)
  for w in 0 1 2; do
    docker exec "${workers[$w]}" sh -c 'while systemctl list-units --plain --no-legend --state=active,activating,deactivating \
                                          "batchq-pg*@*.service" "bench-daemon-*.service" | grep -q .; do sleep 0.1; done'
  done
  workers_used=$(($(workers_cpu) - workers_before)) database_used=$(($(container_cpu "$database") - database_before))
  [ "$(sql "SELECT count(*) FROM batchq_jobs WHERE state = 'done'")" = "$jobs" ] \
    || { echo "fleet.sh: $variant x$n left jobs undone" >&2; exit 1; }
  echo "$(sql "SELECT round($jobs / (extract(epoch FROM max(done_at)) - $started)) FROM batchq_jobs")" \
       "$((workers_used * limit / jobs / 1000000))" "$((database_used * limit / jobs / 1000000))"
}

read -r -a counts <<<"${FLEET_COUNTS:-1 2 4 6}"
declare -A rates workers_ms database_ms
for ((round = 1; round <= rounds; round++)); do
  for n in "${counts[@]}"; do
    for variant in consumer preload pooled daemon; do
      result=$(drain "$variant" "$n")
      read -r rate worker_cpu database_cpu <<<"$result"
      rates[$variant$n]+="$rate " workers_ms[$variant$n]+="$worker_cpu " database_ms[$variant$n]+="$database_cpu "
    done
    echo "round $round, $n: consumers ${rates[consumer$n]}/ preload ${rates[preload$n]}/" \
         "pooled ${rates[pooled$n]}/ daemons ${rates[daemon$n]}" >&2
  done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "jobs $jobs, work ${work_ms} ms a job, batch $limit, median of $rounds rounds; load average $(cut -d' ' -f1-3 /proc/loadavg)"
table=$(mktemp)
{
  echo "| instances | consumers jobs/s | with preload | with preload and pooler | daemons jobs/s" \
       "| consumers / daemons | with preload / daemons | with preload and pooler / daemons |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for n in "${counts[@]}"; do
    c=$(median <<<"${rates[consumer$n]}") p=$(median <<<"${rates[preload$n]}")
    q=$(median <<<"${rates[pooled$n]}") d=$(median <<<"${rates[daemon$n]}")
    awk -v n="$n" -v c="$c" -v p="$p" -v q="$q" -v d="$d" \
      'BEGIN {printf "| %d | %d | %d | %d | %d | %.2f | %.2f | %.2f |\n", n, c, p, q, d, c / d, p / d, q / d}'
  done
} | tee "$table"
echo
echo "CPU ms a batch of $limit jobs cost the three workers together / the database (median):"
echo "| instances | consumers | with preload | with preload and pooler | daemons |"
echo "| --- | --- | --- | --- | --- |"
for n in "${counts[@]}"; do
  row="| $n |"
  for variant in consumer preload pooled daemon; do
    row+=" $(median <<<"${workers_ms[$variant$n]}") / $(median <<<"${database_ms[$variant$n]}") |"
  done
  echo "$row"
done
plot_dir=${BENCH_PLOT_DIR-docs/docsite/rst/images}
if [ -n "$plot_dir" ]; then
  make -s "$PWD/.cache/docs-venv/.installed"
  mkdir -p "$plot_dir"
  .cache/docs-venv/bin/python benchmarks/plot.py fleet "$table" "$plot_dir/fleet-batch$limit.png" \
    "One PostgreSQL queue, batches of $limit"
fi
rm -f "$table"
