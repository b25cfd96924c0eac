#!/usr/bin/env bash
# Builds a systemd-ready Debian image from Debian's own packages, because no
# container registry is reachable from here.
# Usage: tools/build-image.sh [--bare] SUITE [TAG [EXTRA_PACKAGES]]
#   e.g. tools/build-image.sh trixie
#        tools/build-image.sh --bare trixie        (batchq/debian-bare:trixie)
#        tools/build-image.sh bookworm batchq/postgresql:bookworm postgresql
# --bare builds a host as a new user has one: systemd and python3 alone. No
# node_exporter, no sudo, no pgbouncer, no procps: the role must work there.
# An image built by the same recipe (this script, suite and extra packages) is
# reused; a changed recipe rebuilds it, and so does FORCE=1.
#
# Two stages. The first is a bare host: debootstrap with systemd and python3.
# The second installs the other packages with apt in the image's root. An
# image that has a second stage starts from the suite's bare image when this
# script built it by the same recipe, and bootstraps its own first stage
# otherwise: debootstrap is most of a build's CPU, and `make images` builds
# the bare images first.
set -euo pipefail

bare=
if [ "${1:-}" = --bare ]; then bare=1; shift; fi
suite=${1:?usage: tools/build-image.sh [--bare] SUITE [TAG [EXTRA_PACKAGES]]}
tag=${2:-batchq/debian${bare:+-bare}:$suite}
extra=${3:-}

recipe=$( { cat "$0"; echo "$bare $suite $extra"; } | sha256sum | cut -c1-16)
built=$(docker image inspect -f '{{ index .Config.Labels "batchq.recipe" }}' "$tag" 2>/dev/null || true)
if [ -z "${FORCE:-}" ] && [ "$built" = "$recipe" ]; then
  echo "image $tag exists, reusing it"
  exit 0
fi

# Use the mirror this machine's apt already uses, so nothing names a host.
mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}
                                /^deb / && $3 ~ /\/debian\/?$/ {print $3; exit}' \
                          /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null)}
[ -n "$mirror" ] || { echo "no Debian mirror found in apt sources; set DEBIAN_MIRROR" >&2; exit 1; }

# Everything a test needs inside a container is baked in here: containers
# have no package mirror of their own. sudo is there to test become with it;
# node_exporter serves the consumers' metrics; psycopg runs the PostgreSQL
# example consumer (bullseye has only psycopg2, which it uses there), and
# pgbouncer its local pooler (examples/postgresql_queue/pooler.yml). boto3
# runs the SQS example consumer on the fleet scenario's workers, and Debian
# 13's moto (with flask-cors, which its server needs) the fleet's stand-in for
# SQS and DynamoDB (molecule/fleet/files/batchq-moto); in the image, the
# fleet's prepare step has no apt to run.
packages=
if [ -z "$bare" ]; then
  packages=dbus,procps,iproute2,sudo,prometheus-node-exporter,pgbouncer,python3-boto3
  case $suite in
    bullseye) packages+=,python3-psycopg2 ;;
    trixie) packages+=,python3-psycopg,python3-moto,python3-flask-cors ;;
    *) packages+=,python3-psycopg ;;
  esac
fi
[ -z "$extra" ] || packages+=${packages:+,}$extra

# An older debootstrap has no script for a newer suite (Debian 12's knows no
# forky); testing is bootstrapped like sid.
script=/usr/share/debootstrap/scripts/$suite
[ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid

root=$(mktemp -d /var/tmp/batchq-rootfs.XXXXXX)
chmod 755 "$root"  # as / is: apt's downloads and su in maintainer scripts run as other users
# --one-file-system: never into the /proc that the second stage mounts
trap 'umount "$root/proc" 2>/dev/null || true; rm -rf --one-file-system "$root" "$root.log"' EXIT
fail() { tail -20 "$root.log" >&2; exit 1; }

# The first stage: the suite's bare image, or debootstrap.
bare_tag=batchq/debian-bare:$suite
bare_recipe=$( { cat "$0"; echo "1 $suite "; } | sha256sum | cut -c1-16)
if [ -n "$packages" ] && [ "$(docker image inspect -f '{{ index .Config.Labels "batchq.recipe" }}' "$bare_tag" \
                             2>/dev/null || true)" = "$bare_recipe" ]; then
  container=$(docker create "$bare_tag")
  # --numeric-owner: the image's own users and groups, not this machine's of the same names
  docker export "$container" | tar --numeric-owner -C "$root" -x
  docker rm "$container" >/dev/null
else
  debootstrap --variant=minbase --include=systemd,systemd-sysv,python3 "$suite" "$root" "$mirror" "$script" \
    >"$root.log" 2>&1 || fail
fi

# The second stage: apt, as on a host; no service starts in the root.
if [ -n "$packages" ]; then
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  mount -t proc proc "$root/proc"
  # The mirror may serve testing's lists past their Valid-Until date, as debootstrap accepts them.
  chroot "$root" sh -c "apt-get -q -o Acquire::Check-Valid-Until=false update && DEBIAN_FRONTEND=noninteractive \
    apt-get -qy install --no-install-recommends ${packages//,/ }" >"$root.log" 2>&1 || fail
  umount "$root/proc"
  rm -f "$root/usr/sbin/policy-rc.d"
fi

# A container has no consoles to log in on, and the host's network is given.
chroot "$root" systemctl mask getty.target console-getty.service systemd-networkd-wait-online.service >/dev/null 2>&1 || true
# pgbouncer runs where pooler.yml configures it, not in every test container.
chroot "$root" systemctl disable pgbouncer.service >/dev/null 2>&1 || true
# On a host, systemd makes every mount shared at boot; in a container it leaves
# the engine's mounts as they are, and the credentials it mounts for a unit's
# run (under /run/credentials) would stay out of the reach of a unit with a
# mount namespace of its own. /run is made shared at every boot, and the rest
# private: the container's / is the engine's slave, and each `docker cp` into
# it would bring another copy of the engine's /sys/fs/cgroup mounts, every
# sandboxed start growing slower with them (300 ms of CPU instead of 70 after
# 14 copies). A unit named apart from the batchq- units, which the role owns.
# Bare images have it too: it is what systemd does on any host, not a package
# a user would install.
cat >"$root/etc/systemd/system/shared-mounts.service" <<'UNIT'
[Unit]
Description=Share /run's mounts with the units' namespaces, as systemd does on a host
DefaultDependencies=no
Before=sysinit.target

[Service]
Type=oneshot
ExecStart=/bin/mount --make-rprivate /
ExecStart=/bin/mount --make-shared /run

[Install]
WantedBy=sysinit.target
UNIT
chroot "$root" systemctl enable shared-mounts.service >/dev/null 2>&1
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* "$root"/var/log/apt/*
: >"$root/etc/machine-id"

tar -C "$root" -c . | docker import -c 'CMD ["/lib/systemd/systemd"]' -c 'ENV container=docker' \
  -c "LABEL batchq.recipe=$recipe" - "$tag" >/dev/null
echo "built $tag"
