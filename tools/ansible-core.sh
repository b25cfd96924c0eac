#!/usr/bin/env bash
# Runs make targets under one ansible-core, pinned with every test dependency
# in requirements/ansible-core-RELEASE.txt.
# Usage: tools/ansible-core.sh VERSION [MAKE ARGUMENTS...]
#   e.g. tools/ansible-core.sh 2.16 unit sanity
#        tools/ansible-core.sh 2.21 molecule SCENARIOS=default
# VERSION is a release (2.21.5) or its series (2.21). Each release gets its own
# venv, tarball and installed collection in .cache/ansible-core-RELEASE, molecule
# state and container names (BATCHQ_HOST_PREFIX-RELEASE-...), so two releases
# can run at once. This machine's Python is 3.11; ansible-core 2.20 and later
# need 3.12+, so they run in the Debian 13 controller
# container (python3.13; `make controller-image`) with this work tree at the
# same path and the docker socket, after the images are built here.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: tools/ansible-core.sh VERSION [MAKE ARGUMENTS...]"
want=${1:?$usage}
shift
pins=()
for file in requirements/ansible-core-"$want".txt requirements/ansible-core-"$want".[0-9]*.txt; do
  [ -f "$file" ] && pins+=("$file")
done
if [ ${#pins[@]} -ne 1 ]; then
  echo "no single pinned file for ansible-core $want; there are:" requirements/ansible-core-*.txt >&2
  exit 2
fi
release=$(basename "${pins[0]}" .txt)
release=${release#ansible-core-}
cache=$PWD/.cache/ansible-core-$release
prefix=${BATCHQ_HOST_PREFIX:-batchq}-${release//./}
mkdir -p "$cache"

minor=$(echo "$release" | cut -d. -f2)
if [ "$minor" -lt 20 ]; then
  exec make PYTHON=python3.11 VENV="$cache/venv" REQUIREMENTS="${pins[0]}" CACHE="$cache" \
    BATCHQ_HOST_PREFIX="$prefix" "$@"
fi

image=${CONTROLLER_IMAGE:-batchq/controller:trixie}
make images controller-image CONTROLLER_IMAGE="$image" >/dev/null
# pip in the container reads this machine's pip configuration, CA bundle and
# the local package folders that configuration names (an index's whole folder:
# its simple/ pages link to files beside it).
mounts=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
confs=()
for conf in /etc/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
  [ -f "$conf" ] && confs+=("$conf") && mounts+=(-v "$conf:${conf/#$HOME//root}:ro")
done
for dir in $( { cat "${confs[@]}" /dev/null; env | grep '^PIP_'; } | grep -oE '(file://)?/[^ ]+' | sed 's,^file://,,; s,/simple/*$,,' | sort -u); do
  [ -d "$dir" ] && mounts+=(-v "$dir:$dir:ro")
done
# A git worktree keeps its repository outside the tree; sanity.sh lists files with git.
common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
case $common in "$PWD"/* | "") ;; *) mounts+=(-v "$common:$common:ro") ;; esac
envs=()
while IFS='=' read -r name _; do envs+=(-e "$name"); done < <(env | grep -E '^(PIP_[A-Z_]+|CI)=' || true)

# The images are built above, on this machine: the container has no debootstrap.
exec docker run --rm --name "$prefix-controller-$$" --network host \
  -v /var/run/docker.sock:/var/run/docker.sock -v "$PWD:$PWD" -w "$PWD" "${mounts[@]}" "${envs[@]}" \
  "$image" make -o images -o engine PYTHON=python3.13 VENV="$cache/venv" REQUIREMENTS="${pins[0]}" \
  CACHE="$cache" BATCHQ_HOST_PREFIX="$prefix" "$@"
