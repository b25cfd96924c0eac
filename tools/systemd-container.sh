#!/usr/bin/env bash
# Starts a container with systemd as PID 1 and waits until it has booted.
# Usage: tools/systemd-container.sh NAME IMAGE
# CGROUP_SOURCE=/sys/fs/cgroup/unified gives systemd 262 and later (Debian
# testing), which no longer boot in a hybrid tree, the unified hierarchy alone.
# Without --privileged, which this kind of machine refuses; the molecule
# platforms in .config/molecule/config.yml use the same options.
set -euo pipefail
name=${1:?usage: tools/systemd-container.sh NAME IMAGE}
image=${2:?usage: tools/systemd-container.sh NAME IMAGE}
docker rm -f "$name" >/dev/null 2>&1 || true
docker run -d --name "$name" --hostname "$name" \
  --cap-add SYS_ADMIN --cap-add SYS_PTRACE --cap-add NET_ADMIN --cap-add SYS_NICE \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
  --cgroupns=host -v "${CGROUP_SOURCE:-/sys/fs/cgroup}":/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock \
  "$image" /lib/systemd/systemd >/dev/null
# "degraded" is booted too; is-system-running exits non-zero for it.
docker exec "$name" systemctl is-system-running --wait >/dev/null 2>&1 || true
