#!/usr/bin/env bash
# Sourced by the PostgreSQL benchmarks (fleet.sh, elastic.sh): one PostgreSQL
# host (Debian's postgresql) and three workers (two Debian 12, one Debian 13)
# on a network of their own, an inventory of them in $work/inventory.yml, and
# sql() on the database. The containers and $work go when the script exits.
# Usage: source benchmarks/pg_fleet.sh NAME   (containers BATCHQ_HOST_PREFIX-bench-NAME-*)
prefix=${BATCHQ_HOST_PREFIX:-batchq}-bench-$1
script=$(basename "$0")
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/.cache/collections
export ANSIBLE_PIPELINING=true ANSIBLE_PYTHON_INTERPRETER=auto_silent ANSIBLE_BECOME_METHOD=su
database=$prefix-db network=$prefix
workers=("$prefix-1" "$prefix-2" "$prefix-3")
images=("${BATCHQ_IMAGE_DEBIAN12:-batchq/debian:bookworm}" "${BATCHQ_IMAGE_DEBIAN12:-batchq/debian:bookworm}"
        "${BATCHQ_IMAGE_DEBIAN13:-batchq/debian:trixie}")
# shellcheck disable=SC2034  # the sourcing script uses it
password=bench-only-password
work=$(mktemp -d)
trap 'echo "$script: failed at line $LINENO" >&2' ERR
trap 'docker rm -f "${workers[@]}" "$database" >/dev/null 2>&1 || true
      docker network rm "$network" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

for i in "${!workers[@]}"; do tools/systemd-container.sh "${workers[$i]}" "${images[$i]}"; done
tools/systemd-container.sh "$database" "${BATCHQ_IMAGE_POSTGRESQL:-batchq/postgresql:bookworm}"
docker network inspect "$network" >/dev/null 2>&1 || docker network create "$network" >/dev/null
for host in "${workers[@]}" "$database"; do docker network connect "$network" "$host"; done

cat >"$work/inventory.yml" <<EOF
consumers: {hosts: {${workers[0]}: {}, ${workers[1]}: {}, ${workers[2]}: {}}}
queue_db: {hosts: {$database: {}}}
all: {vars: {ansible_connection: community.docker.docker}}
EOF

sql() { docker exec "$database" runuser -u postgres -- psql -d batchq -AtX -v ON_ERROR_STOP=1 -c "$1"; }
