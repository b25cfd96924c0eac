#!/usr/bin/env bash
# Runs the test matrix of `make test` (tools/ansible-core.sh for each part):
# unit tests and ansible-test sanity under the oldest and the newest
# ansible-core, the `default` scenario under every supported one, the full
# suite under the newest. At most JOBS (default 2) parts run at once: a
# scenario's containers mostly wait on timers, so two fit a 2-core machine
# (README: Support). MATRIX_ONLY=REGEX runs only the parts it matches.
# Each part logs to .cache/matrix/PART.log; a summary with each part's minutes
# closes the run, and a failed part fails it.
set -euo pipefail
cd "$(dirname "$0")/.."

oldest=2.16 newest=2.21
parts=(
  "$newest molecule SCENARIOS=default"
  "2.22 molecule SCENARIOS=default"
  "$oldest molecule SCENARIOS=default"
  "2.18 molecule SCENARIOS=default"
  "2.19 molecule SCENARIOS=default"
  "2.20 molecule SCENARIOS=default"
  "$newest molecule SCENARIOS=info"
  "$newest molecule SCENARIOS=drain"
  "$newest molecule SCENARIOS=faults"
  "$newest molecule SCENARIOS=fleet"
  "$newest unit sanity"
  "$oldest unit sanity"
)
[ -z "${MATRIX_ONLY:-}" ] || mapfile -t parts < <(printf '%s\n' "${parts[@]}" | grep -E -- "$MATRIX_ONLY")
jobs=${JOBS:-2}
logs=.cache/matrix
rm -rf "$logs" && mkdir -p "$logs"

run() {  # PART [MAKE OPTIONS]: runs it, then writes its verdict and minutes to its .result
  local name=${1// /-} began=$SECONDS status=passed words
  name=${name//SCENARIOS=/}
  read -ra words <<<"$1"
  tools/ansible-core.sh "${words[@]}" "${@:2}" >"$logs/$name.log" 2>&1 || status=FAILED
  awk -v part="$1" -v status=$status -v s=$((SECONDS - began)) \
    'BEGIN { printf "%-36s %-7s %5.1f min\n", part, status, s / 60 }' | tee "$logs/$name.result"
}

pool() {  # PART...: runs them, at most JOBS at once, each with the make options in $options
  for part in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    run "$part" "${options[@]}" &
  done
  wait
}

failed() { grep -l FAILED "$logs"/*.result 2>/dev/null; }

start=$SECONDS
# Each release installs its venv and collection once; then its parts share them.
mapfile -t setups < <(printf '%s\n' "${parts[@]}" | cut -d' ' -f1 | sort -uV | sed 's/$/ collection/')
options=()
pool "${setups[@]}"
options=(-o collection)
failed >/dev/null || pool "${parts[@]}"

echo "matrix: $(cat "$logs"/*.result | wc -l) parts in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
cat "$logs"/*.result
if failed >/dev/null; then
  for result in $(failed); do
    echo "=== ${result%.result}.log (last 60 lines)"; tail -n 60 "${result%.result}.log"
  done
  exit 1
fi
