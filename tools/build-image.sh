#!/usr/bin/env bash
# Builds a systemd-ready Debian image from Debian's own packages, because no
# container registry is reachable from here (SYSTEMD_FACTS.md §17).
# Usage: tools/build-image.sh SUITE [TAG]   e.g. tools/build-image.sh trixie
# An image that already exists is reused; FORCE=1 rebuilds it.
set -euo pipefail

suite=${1:?usage: tools/build-image.sh SUITE [TAG]}
tag=${2:-batchq/debian:$suite}

if [ -z "${FORCE:-}" ] && docker image inspect "$tag" >/dev/null 2>&1; then
  echo "image $tag exists, reusing it"
  exit 0
fi

# Use the mirror this machine's apt already uses, so nothing names a host.
mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}
                                /^deb / && $3 ~ /\/debian\/?$/ {print $3; exit}' \
                          /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null)}
[ -n "$mirror" ] || { echo "no Debian mirror found in apt sources; set DEBIAN_MIRROR" >&2; exit 1; }

# Everything a test needs inside a container is baked in here: containers
# have no package mirror of their own.
packages=systemd,systemd-sysv,dbus,python3,procps,iproute2

root=$(mktemp -d /var/tmp/batchq-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"

# A container has no consoles to log in on, and the host's network is given.
chroot "$root" systemctl mask getty.target console-getty.service systemd-networkd-wait-online.service >/dev/null 2>&1 || true
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
: >"$root/etc/machine-id"

tar -C "$root" -c . | docker import -c 'CMD ["/lib/systemd/systemd"]' -c 'ENV container=docker' - "$tag" >/dev/null
echo "built $tag"
