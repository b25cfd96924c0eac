#!/usr/bin/env bash
# The demo fleet: three systemd containers (two Debian 12, one Debian 13)
# with the example consumers of demo/group_vars deployed and reporting, and a
# PostgreSQL host whose queue they drain (examples/postgresql_queue).
#   tools/demo.sh up     start the fleet, deploy, wait for first runs, show them
#   tools/demo.sh down   remove the fleet
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=(batchq-demo-1 batchq-demo-2 batchq-demo-3)
images=("${BATCHQ_IMAGE_DEBIAN12:-batchq/debian:bookworm}" "${BATCHQ_IMAGE_DEBIAN12:-batchq/debian:bookworm}"
        "${BATCHQ_IMAGE_DEBIAN13:-batchq/debian:trixie}")

database=batchq-demo-db network=batchq-demo

down() {
  docker rm -f "${hosts[@]}" "$database" >/dev/null 2>&1 || true
  docker network rm "$network" >/dev/null 2>&1 || true
  echo "demo fleet removed"
}

# node_exporter's page; 127.0.0.1: localhost may be ::1 where IPv6 is off
metrics="import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())"

up() {
  for i in "${!hosts[@]}"; do
    tools/systemd-container.sh "${hosts[$i]}" "${images[$i]}"
  done
  tools/systemd-container.sh "$database" "${BATCHQ_IMAGE_POSTGRESQL:-batchq/postgresql:bookworm}"
  # a network of their own, where the workers find the database by name
  docker network inspect "$network" >/dev/null 2>&1 || docker network create "$network" >/dev/null
  for host in "${hosts[@]}" "$database"; do docker network connect "$network" "$host"; done
  echo "demo fleet is up: ${hosts[*]} $database"
  ansible-playbook -i demo/inventory.yml examples/postgresql_queue/database.yml
  ansible-playbook -i demo/inventory.yml examples/postgresql_queue/deploy.yml
  ansible-playbook -i demo/inventory.yml demo/wait.yml
  demo/drain.sh 20000
  ansible-playbook -i demo/inventory.yml batchq.consumers.consumer_status
  echo "A few of the Prometheus metrics of batchq-demo-1 (node_exporter; docs/docsite/rst/guide_monitoring.rst):"
  docker exec batchq-demo-1 python3 -c "$metrics" | grep -E '^batchq_consumer_(runs_total|last_run_success)' | head -n 8 || true
  echo "All of them: docker exec batchq-demo-1 python3 -c \"$metrics\" | grep ^batchq_"
  echo "Look around: docker exec -it batchq-demo-1 systemctl list-timers 'batchq-*'"
  echo "Run the playbooks on it (README, \"Try it locally\"):"
  echo "  export PATH=\$PWD/.venv/bin:\$PATH ANSIBLE_COLLECTIONS_PATH=\$PWD/.cache/collections"
  echo "  ansible-playbook -i demo/inventory.yml batchq.consumers.consumer_control -e consumer_action=pause"
  echo "Remove the fleet: make demo-down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
