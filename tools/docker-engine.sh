#!/usr/bin/env bash
# Makes sure Debian's docker engine and debootstrap are installed and the
# engine answers. CI starts on a machine where neither is running.
set -euo pipefail

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! timeout 10 docker info >/dev/null 2>&1; then
  echo "starting dockerd"
  # systemd may manage docker on a full machine; a bare one needs it started by hand.
  if ! { command -v systemctl >/dev/null 2>&1 && systemctl start docker 2>/dev/null; }; then
    nohup dockerd >/var/log/batchq-dockerd.log 2>&1 &
  fi
  for _ in $(seq 60); do
    timeout 5 docker info >/dev/null 2>&1 && break
    sleep 1
  done
fi
timeout 10 docker info >/dev/null 2>&1 || { echo "docker engine did not come up" >&2; tail -20 /var/log/batchq-dockerd.log >&2 || true; exit 1; }
echo "docker engine $(docker version --format '{{.Server.Version}}') is up"
