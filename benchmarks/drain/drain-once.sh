#!/usr/bin/env bash
# Runs inside a benchmark container (benchmarks/drain.sh copies it there):
# fills the queue of batch size BATCH with ITEMS items, drains it one way and
# prints "SECONDS BATCHES ITEMS SPAN" (BATCHES: lines in batches.log, one per
# batch the consumer ran, the last one often empty; SPAN: seconds from the
# first batch's start to the last one's end, by the consumer's own clock).
# Usage: drain-once VARIANT BATCH ITEMS [WRAPPER]
#   a  systemctl start batchq-bench-BATCH.service (the role's drain mode; a
#      oneshot start returns when the activation, every batch of it, ends)
#   b  systemctl start --wait bench-daemon-BATCH.service (Type=simple, the
#      same sandbox, consumer --loop: one process for all batches)
#   c  a shell loop here as root: a fresh consumer per batch, no systemd
#   w  the WRAPPER (batchq-drain) run by hand as root, no unit: how much of
#      (a) the wrapper costs outside the sandbox and systemd
#   p  systemctl start batchq-py-BATCH.service: (a) with consumer.py, preload
#   n  systemctl start batchq-pyfresh-BATCH.service: (a) with consumer.py,
#      without preload (a fresh interpreter per batch)
# Timed with bash's $EPOCHREALTIME: no process is started to read the clock.
set -euo pipefail
variant=$1 batch=$2 items=$3 wrapper=${4:-}
case $variant in
  p) dir=/srv/drain/py-$batch ;;
  n) dir=/srv/drain/pyfresh-$batch ;;
  *) dir=/srv/drain/$batch ;;
esac
consumer=/usr/local/bin/drain-consumer
echo "$items" >"$dir/items"
: >"$dir/batches.log"
started=$EPOCHREALTIME
case $variant in
  a) systemctl start "batchq-bench-$batch.service" ;;
  b) systemctl start --wait "bench-daemon-$batch.service" ;;
  c) while "$consumer" "$dir" "$batch" >/dev/null; [ $? -eq 75 ]; do :; done ;;
  w) python3 -I "$wrapper" --spec "${wrapper%/*}/bench-w.json" --unit bench-w.service -- "$consumer" "$dir" "$batch" ;;
  p) systemctl start "batchq-py-$batch.service" ;;
  n) systemctl start "batchq-pyfresh-$batch.service" ;;
  *) echo "drain-once: no variant $variant" >&2; exit 2 ;;
esac
ended=$EPOCHREALTIME
left=$(<"$dir/items")
[ "$left" -eq 0 ] || { echo "drain-once: $variant left $left items" >&2; exit 1; }
span=$(awk 'NR == 1 {first = $1} {last = $2} END {printf "%.6f", (last - first) / 1e9}' "$dir/batches.log")
echo "$ended $started $(wc -l <"$dir/batches.log") $items $span" | awk '{printf "%.6f %d %d %s\n", $1 - $2, $3, $4, $5}'
