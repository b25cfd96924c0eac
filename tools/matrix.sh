#!/usr/bin/env bash
# Runs the test matrix of `make test` (tools/ansible-core.sh for each part):
# unit tests and ansible-test sanity under the oldest and the newest
# ansible-core; the PostgreSQL example's tests (tests/pgqueue) and the queue
# library's and SQS example's (tests/queues) once; every
# scenario on all its hosts (Debian 11, 12, 13, and testing in `default`)
# under the newest; and the short `compat` scenario under each other release
# on one host, a different Debian for each, inside that release's target
# Pythons (the support guide). Two
# lanes run side by side, each part after part, about half the minutes in each.
# It builds the images first (`make images controller-image`), and with
# MATRIX_LINT=1 (`make test`) runs `make lint` and `make release-check` (Galaxy's
# importer and ansible-builder on a tarball) meanwhile and `make rules` after.
# MATRIX_ONLY=REGEX runs only the parts it matches.
# Each part logs to .cache/matrix/PART.log, each line after the part's seconds
# so far ("[ 123] "); a summary with each part's minutes closes the run, and a
# failed part fails it.
set -euo pipefail
cd "$(dirname "$0")/.."

oldest=2.16 newest=2.21
# The lanes are balanced by the minutes each part took (CONTRIBUTING.md).
# The compat part under 2.18 is in the second lane: capacity grew in the
# first, and fleet shrank in the second.
# Never two of the heaviest (default, faults, drain) side by side: together they
# overload the two cores, and the timing tests of faults and drain fail. Nor
# a third lane: the parts are bound by the two cores, not by their waits (a
# run with a third lane for compat, info and capacity took default from 10.4
# to 18.0 minutes).
# A lane installs the releases of 2.20 and later itself (in the controller
# image, a minute at most), before its first part under that release, so
# that it need not wait for the other lane. "after PART" waits until that
# part of the other lane is done.
first=(
  "$newest collection"
  "$newest molecule SCENARIOS=default"
  "$newest molecule SCENARIOS=faults"
  "$newest molecule SCENARIOS=drain"
  "$newest molecule SCENARIOS=capacity"
  "2.19 molecule SCENARIOS=compat PLATFORM=debian13"
  "2.20 collection"
  "2.20 molecule SCENARIOS=compat PLATFORM=debiantesting"
  "after 2.22 collection"
  "2.22 molecule SCENARIOS=compat PLATFORM=debiantesting"
)
second=(
  "2.22 collection"
  "$oldest unit sanity"
  "$oldest pgqueue"
  "$oldest queues"
  "after $newest collection"
  "$newest unit sanity"
  "$newest molecule SCENARIOS=info"
  "$newest molecule SCENARIOS=fleet"
  "$oldest molecule SCENARIOS=compat PLATFORM=debian11"
  "2.18 molecule SCENARIOS=compat PLATFORM=debian12"
)
setup() { grep -E "$@" -e ' collection$' -e '^after '; }
# MATRIX_ONLY keeps the parts it matches, and the set-ups of their releases
used=$(printf '%s\n' "${first[@]}" "${second[@]}" | setup -v | { grep -E -- "${MATRIX_ONLY:-.}" || true; } | cut -d' ' -f1 | sort -u)
only() {
  local part release
  for part in "$@"; do
    if printf '%s\n' "$part" | setup -q; then
      release=${part#after }
      grep -qxF "${release% collection}" <<<"$used" || continue
    else
      grep -qE -- "${MATRIX_ONLY:-.}" <<<"$part" || continue
    fi
    printf '%s\n' "$part"
  done
}
mapfile -t first < <(only "${first[@]}")
mapfile -t second < <(only "${second[@]}")
jobs=2
logs=.cache/matrix
rm -rf "$logs" && mkdir -p "$logs"

stamped() {  # BEGAN: each line of stdin after the seconds since BEGAN ($SECONDS), where the minutes of a part go
  local line
  while IFS= read -r line || [ -n "$line" ]; do printf '[%4d] %s\n' $((SECONDS - $1)) "$line"; done
}

run() {  # PART [MAKE OPTIONS]: runs it, then writes its verdict and minutes to its .result
  # PART: "RELEASE TARGETS..." (make under that ansible-core) or "make TARGETS..." (this tree's .venv)
  local name=${1// /-} began=$SECONDS status=passed words
  name=${name//SCENARIOS=/}
  name=${name//PLATFORM=/}
  read -ra words <<<"$1"
  if [ "${words[0]}" = make ]; then
    make "${words[@]:1}" 2>&1 | stamped "$began" >"$logs/$name.log" || status=FAILED
  else
    tools/ansible-core.sh "${words[@]}" "${@:2}" 2>&1 | stamped "$began" >"$logs/$name.log" || status=FAILED
  fi
  awk -v part="$1" -v status=$status -v s=$((SECONDS - began)) \
    'BEGIN { printf "%-36s %-7s %5.1f min\n", part, status, s / 60 }' | tee "$logs/$name.result"
}

pool() {  # PART...: runs them, two at once, each with the make options in $options
  for part in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    run "$part" "${options[@]}" &
  done
  wait
}

lane() {  # PART...: runs them one after another, with the make options in $options (not a set-up)
  local part
  for part in "$@"; do
    case $part in
      after\ *)  # another lane's part: wait for its verdict
        part=${part#after }
        until [ -e "$logs/${part// /-}.result" ]; do sleep 5; done ;;
      *\ collection) run "$part" ;;
      *) run "$part" "${options[@]}" ;;
    esac
  done
}

failed() { grep -l FAILED "$logs"/*.result 2>/dev/null; }

start=$SECONDS
# Each release installs its venv and collection once; then its parts share them.
# Releases before 2.20 install on this machine, and so does lint: all of that
# runs while the images build (minutes on a fresh machine). release-check comes
# last: once the images are built, it runs beside lint, the longest of them. 2.20 and later
# install in the controller image, in a lane. The alert rules' check runs
# in a lane too, after this step, because it may run apt-get, as the engine's
# install does (one apt at a time).
mapfile -t setups < <(printf '%s\n' "${first[@]}" "${second[@]}" | grep -v -e '^after ' -e ' collection$' |
  cut -d' ' -f1 | sort -uV | sed 's/$/ collection/')
local_setups=()
for setup in "${setups[@]}"; do
  minor=$(echo "$setup" | cut -d' ' -f1 | cut -d. -f2)
  if [ "$minor" -lt 20 ]; then local_setups+=("$setup"); fi
done
options=()
pool "make images controller-image" ${MATRIX_LINT:+"make lint"} "${local_setups[@]}" ${MATRIX_LINT:+"make release-check"}
options=(-o collection)
if ! failed >/dev/null; then
  lane "${first[@]}" &
  lane ${MATRIX_LINT:+"make rules"} "${second[@]}" &
  wait
fi

echo "matrix: $(cat "$logs"/*.result | wc -l) parts in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
cat "$logs"/*.result
if failed >/dev/null; then
  for result in $(failed); do
    log=${result%.result}.log
    # pytest's summary names the failed tests, and molecule's output follows it:
    # show the failures' own lines first, then the end of the log. (Each line
    # begins with its seconds, "[ 123] ".)
    echo "=== $log: what failed"
    sed -n '/= short test summary info =/,/^\[ *[0-9]*\] =.* in [0-9.]*s/p' "$log" | cut -c1-400
    grep -E '^\[ *[0-9]+\] (E  |FAILED |ERROR )|fatal: |FAILED! =>' "$log" | head -n 40 | cut -c1-400 || true
    echo "=== $log (last 30 lines)"; tail -n 30 "$log"
  done
  exit 1
fi
