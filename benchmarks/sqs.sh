#!/usr/bin/env bash
# Drains an SQS queue (a local moto server) with batchq-sqs, one process per
# batch, and with long-lived daemons, and prints what a fresh process per
# batch costs (issue 29).
# Usage: make queues && benchmarks/sqs.sh [MESSAGES]    (default 500: about 2 minutes on 2 cores)
# Environment: SQS_WORK_MS (the stand-in's work per message, a sleep, default 1),
# BATCHQ_QUEUES_VENV (the venv with boto3 and moto_server, default .cache/queues-venv).
#
# One moto server on a free port of 127.0.0.1. Each mode gets a standard queue
# of its own with a dead-letter queue (redrive maxReceiveCount 5, above
# --max-attempts 3), filled with MESSAGES jobs by batchq-sqs-enqueue (no
# poison jobs), then drained:
#   limit 10, limit 100: `batchq-sqs --limit B` again and again while it exits
#       the backlog code (75), a new process per batch, until it exits 0: what
#       a consumer with backlog_exit_code: 75 does under systemd, without
#       systemd's own share;
#   daemon: benchmarks/sqs_daemon.py, one process that runs batchq-sqs's own
#       batch (--limit 10) in a loop, with the same work per message (a child
#       process, --work-ms, a result file) and the same DeleteMessageBatch;
#   bare daemon: sqs_daemon.py --bare, a plain receive (10 messages, a long
#       poll of 1 s), --work-ms of sleep a message in the same process, one
#       DeleteMessageBatch; no child process, no result file.
# So limit B against the daemon is the cost of a process per batch: Python's
# start, boto3's import, the library's, the client and the queue's check
# (GetQueueAttributes, GetQueueUrl), spread over B messages. The bare daemon
# shows what the contract's work per message (the child process, the result
# file) costs on top.
# Each drain ends with one empty long poll of 1 s (--wait-seconds 1), in every
# mode. Prints, one a line: the messages; each mode's seconds, messages/s,
# processes (batches) or receives, and CPU (user + system of the mode's
# processes and their children, and the moto server's); each batch mode's
# ratio to the daemons' messages/s; and for limit 10 and 100 the CPU a
# process costs beyond the daemon's: (its CPU - the daemon's) / (its processes
# - 1). The CPU is the steadier figure: the moto server's own work is most of
# the wall time, and it shares the cores. One run: run it twice to see how
# much it varies.
set -euo pipefail
cd "$(dirname "$0")/.."
messages=${1:-500}
[ "$messages" -ge 1 ] || { echo "sqs.sh: MESSAGES must be 1 or more" >&2; exit 2; }
work_ms=${SQS_WORK_MS:-1}
venv=${BATCHQ_QUEUES_VENV:-$PWD/.cache/queues-venv}
python=$venv/bin/python
[ -x "$venv/bin/moto_server" ] || { echo "sqs.sh: no $venv/bin/moto_server: run make queues" >&2; exit 2; }
work=$(mktemp -d)
server=""
trap 'echo "sqs.sh: failed at line $LINENO" >&2' ERR
trap '[ -z "$server" ] || kill -KILL -- "-$server" 2>/dev/null || true; rm -rf "$work"' EXIT

# No real credentials, no instance metadata: the consumer's credential, as the role gives it.
unset "${!AWS_@}"
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true
export CREDENTIALS_DIRECTORY=$work/credentials PYTHONDONTWRITEBYTECODE=1
mkdir "$CREDENTIALS_DIRECTORY"
printf '[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n' >"$CREDENTIALS_DIRECTORY/aws"

port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
endpoint=http://127.0.0.1:$port
# setsid: the server leads a process group of its own, which the trap kills.
setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
server=$!
disown "$server"  # no notice of its kill at the end
for _ in $(seq 100); do
  curl -fsS -o /dev/null "$endpoint/moto-api/" 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$work/moto.log" >&2; exit 1; }
  sleep 0.1
done
curl -fsS -o /dev/null "$endpoint/moto-api/"

sqs() {  # ACTION [ARGUMENT]: queue NAME prints the new queue's URL; left URL the messages on it
  "$python" - "$endpoint" "$@" <<'PY'
import json, sys
import boto3
endpoint, action, argument = sys.argv[1:4]
sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                   aws_access_key_id="testing", aws_secret_access_key="testing")
if action == "queue":
    dlq = sqs.create_queue(QueueName=argument + "-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    print(sqs.create_queue(QueueName=argument, Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": arn, "maxReceiveCount": "5"})})["QueueUrl"])
else:
    total = 0
    for url in (argument, argument + "-dlq"):
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        total += int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])
    print(total)
PY
}

ticks=$(getconf CLK_TCK)
server_cpu() {  # the moto server's CPU so far (user + system), in seconds
  sed 's/.*) //' "/proc/$server/stat" | awk -v ticks="$ticks" '{printf "%.2f", ($12 + $13) / ticks}'
}

options() {  # QUEUE_URL KEY: batchq-sqs's options, the same in every mode, in the array opts
  opts=(--queue-url "$1" --endpoint-url "$endpoint" --region us-east-1 --results "$work/results-$2"
    --work-ms "$work_ms" --max-attempts 3 --wait-seconds 1 --visibility-timeout 60 --job-timeout 20)
}

# Each mode: KEY QUEUE_URL; its log in $work/log-KEY, its processes or receives in $work/units-KEY.
# Errors go to fd 3, the script's standard error: fd 2 is time's.
exec 3>&2
batches() {  # limitB URL: batchq-sqs --limit B while it exits 75, a new process each time
  local limit=${1#limit} code count=0 opts
  options "$2" "$1"
  while :; do
    code=0
    "$python" examples/sqs_queue/batchq-sqs "${opts[@]}" --limit "$limit" 2>>"$work/log-$1" || code=$?
    count=$((count + 1))
    [ "$code" = 75 ] || break
  done
  [ "$code" = 0 ] || { echo "sqs.sh: a batch of --limit $limit exited $code:" >&3; tail -5 "$work/log-$1" >&3; return 1; }
  echo "$count processes" >"$work/units-$1"
}

daemon() {  # daemon|bare URL
  local opts
  options "$2" "$1"
  opts+=(--limit 10)
  [ "$1" != bare ] || opts+=(--bare)
  "$python" benchmarks/sqs_daemon.py "${opts[@]}" 2>"$work/log-$1" \
    || { echo "sqs.sh: the $1 daemon failed:" >&3; tail -5 "$work/log-$1" >&3; return 1; }
  tail -1 "$work/log-$1" | "$python" -c 'import json, sys; counts = json.load(sys.stdin)
print("%d batches" % counts["batches"] if "batches" in counts else "%d receives" % counts["receives"])' \
    >"$work/units-$1"
}

measure() {  # KEY LABEL DRAIN: fills KEY's queue, drains it with DRAIN KEY URL, prints the mode's line
  local key=$1 label=$2 url wall cpu before after TIMEFORMAT='%R %U %S'
  url=$(sqs queue "jobs-$key")
  "$python" examples/sqs_queue/batchq-sqs-enqueue "$messages" --queue-url "$url" --endpoint-url "$endpoint" \
    --region us-east-1 >/dev/null
  before=$(server_cpu)
  { time "$3" "$key" "$url" >/dev/null; } 2>"$work/time-$key"
  after=$(server_cpu)
  read -r wall cpu < <(awk '{printf "%.2f %.2f\n", $1, $2 + $3}' "$work/time-$key")
  [ "$(sqs left "$url")" = 0 ] || { echo "sqs.sh: $label left messages on its queues" >&2; return 1; }
  [ "$key" = bare ] || [ "$(find "$work/results-$key" -type f | wc -l)" = "$messages" ] \
    || { echo "sqs.sh: $label wrote a result for fewer than $messages messages" >&2; return 1; }
  echo "$key $wall $cpu $(cut -d' ' -f1 "$work/units-$key")" >>"$work/figures"
  awk -v label="$label" -v n="$messages" -v wall="$wall" -v cpu="$cpu" -v units="$(cat "$work/units-$key")" \
    -v moto="$(awk -v a="$before" -v b="$after" 'BEGIN {printf "%.2f", b - a}')" \
    'BEGIN {printf "%s: %.2f s, %.0f messages/s, %s, CPU %.2f s (moto server %.2f s)\n", label, wall, n / wall, units, cpu, moto}'
}

echo "messages: $messages a mode, work $work_ms ms a message (a sleep), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
measure limit10 "limit 10" batches
measure limit100 "limit 100" batches
measure daemon daemon daemon
measure bare "bare daemon" daemon
awk -v n="$messages" '
  {rate[$1] = n / $2; cpu[$1] = $3; units[$1] = $4}
  END {
    for (batch = 10; batch <= 100; batch *= 10) {
      key = "limit" batch
      printf "limit %d / daemon: %.2f; / bare daemon: %.2f\n", batch, rate[key] / rate["daemon"], rate[key] / rate["bare"]
    }
    printf "daemon / bare daemon: %.2f\n", rate["daemon"] / rate["bare"]
    # The daemon is one process: each further process of limit B is a start the daemon does not pay.
    for (batch = 10; batch <= 100; batch *= 10) {
      key = "limit" batch
      if (units[key] > 1)
        printf "limit %d: CPU a process beyond the daemon: %.3f s ((%.2f - %.2f) / %d further processes)\n",
          batch, (cpu[key] - cpu["daemon"]) / (units[key] - 1), cpu[key], cpu["daemon"], units[key] - 1
    }
  }' "$work/figures"
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
