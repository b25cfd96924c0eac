#!/usr/bin/env bash
# Enqueues a backlog on the demo's PostgreSQL host, 3 poison jobs among it
# whose work crashes its process, and shows the fleet draining it on one live
# line: jobs left, jobs/s, jobs done per host; the poison jobs end dead.
# Usage: demo/drain.sh [JOBS]   (from tools/demo.sh up)
set -euo pipefail
jobs=${1:-20000}
db=batchq-demo-db
psql() { docker exec "$db" runuser -u postgres -- psql -d batchq -AtX -c "$1"; }

psql "TRUNCATE batchq_results, batchq_jobs RESTART IDENTITY"
password=$(awk '/^pgqueue_password:/ {print $2}' demo/group_vars/all.yml)
docker exec -e PGHOST="$db" -e PGDATABASE=batchq -e PGUSER=batchq -e PGPASSWORD="$password" \
  batchq-demo-1 batchq-pgqueue-enqueue "$jobs" --crashing 3
# The clock starts with the queue full: a consumer may find the jobs before the kick below.
started=$(date +%s.%N)
# The consumers poll the queue every interval (5s); start them now instead.
ansible-playbook -i demo/inventory.yml batchq.consumers.consumer_control -e consumer_action=run \
  -e consumer_names=pgqueue >/dev/null

# jobs/s over the last 5 s: a batch of 100 commits at once, a 1 s rate jumps
times=("$started") lefts=("$jobs")
while :; do
  line=$(psql "SELECT (SELECT count(*) FROM batchq_jobs WHERE state IN ('queued', 'running')) || '|' || coalesce(
                 (SELECT string_agg(host || ' ' || n, '  ' ORDER BY host)
                  FROM (SELECT split_part(done_by, '/', 1) AS host, count(*) AS n
                        FROM batchq_jobs WHERE state = 'done' GROUP BY 1) AS per_host), '')")
  left=${line%%|*} per_host=${line#*|}
  times+=("$(date +%s.%N)") lefts+=("$left")
  [ "${#times[@]}" -le 6 ] || { times=("${times[@]:1}"); lefts=("${lefts[@]:1}"); }
  rate=$(awk -v a="${lefts[0]}" -v b="$left" -v t0="${times[0]}" -v t1="${times[-1]}" 'BEGIN {printf "%.0f", (a - b) / (t1 - t0)}')
  printf '\r%6d jobs left  %5s jobs/s  done: %s   ' "$left" "$rate" "$per_host"
  [ "$left" -gt 0 ] || break
  sleep 1
done
ended=$(date +%s.%N)
# When the last good job was done, and when the poison jobs were dead: a poison job's last attempt comes after its backoff.
printf '\n%d jobs done by %s, the last %.1f s after the enqueue; %s, %.1f s after it\n' \
  "$(psql "SELECT count(*) FROM batchq_jobs WHERE state = 'done'")" \
  "$(psql "SELECT count(DISTINCT split_part(done_by, '/', 2) || split_part(done_by, '/', 1)) || ' consumer instances'
           FROM batchq_jobs WHERE state = 'done'")" \
  "$(psql "SELECT coalesce(extract(epoch FROM max(done_at)) - $started, 0) FROM batchq_jobs WHERE state = 'done'")" \
  "$(psql "SELECT count(*) || ' poison jobs dead after ' || coalesce(string_agg(DISTINCT attempts::text, ', '), '0')
                  || ' attempts (' || coalesce(string_agg(DISTINCT last_error, '; '), 'none') || ')'
           FROM batchq_jobs WHERE state = 'dead'")" \
  "$(awk -v t0="$started" -v t1="$ended" 'BEGIN {print t1 - t0}')"
