#!/usr/bin/env bash
# Runs inside a benchmark container (benchmarks/drain.sh copies it there):
# fills the queue of batch size BATCH with ITEMS items, drains it one way and
# prints "SECONDS BATCHES ITEMS" (BATCHES: lines in batches.log, one per batch
# the consumer ran, the last one often empty).
# Usage: drain-once VARIANT BATCH ITEMS [WRAPPER]
#   a  systemctl start batchq-bench-BATCH.service (the role's drain mode; a
#      oneshot start returns when the activation, every batch of it, ends)
#   b  systemctl start --wait bench-daemon-BATCH.service (Type=simple, the
#      same sandbox, consumer --loop: one process for all batches)
#   c  a shell loop here as root: a fresh consumer per batch, no systemd
#   w  the WRAPPER (batchq-drain) run by hand as root, no unit: how much of
#      (a) the wrapper costs outside the sandbox and systemd
# Timed with bash's $EPOCHREALTIME: no process is started to read the clock.
set -euo pipefail
variant=$1 batch=$2 items=$3 wrapper=${4:-}
dir=/srv/drain/$batch
consumer=/usr/local/bin/drain-consumer
echo "$items" >"$dir/items"
: >"$dir/batches.log"
started=$EPOCHREALTIME
case $variant in
  a) systemctl start "batchq-bench-$batch.service" ;;
  b) systemctl start --wait "bench-daemon-$batch.service" ;;
  c) while "$consumer" "$dir" "$batch" >/dev/null; [ $? -eq 75 ]; do :; done ;;
  w) python3 -I "$wrapper" 75 0 0 -- "$consumer" "$dir" "$batch" ;;
  *) echo "drain-once: no variant $variant" >&2; exit 2 ;;
esac
ended=$EPOCHREALTIME
left=$(<"$dir/items")
[ "$left" -eq 0 ] || { echo "drain-once: $variant left $left items" >&2; exit 1; }
echo "$ended $started $(wc -l <"$dir/batches.log") $items" | awk '{printf "%.6f %d %d\n", $1 - $2, $3, $4}'
