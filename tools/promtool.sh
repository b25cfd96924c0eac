#!/usr/bin/env bash
# Run promtool: the machine's own, or one taken out of Debian's `prometheus`
# package into .cache/promtool without installing it (installing would start a
# Prometheus server on the machine).
set -euo pipefail
cache="$(cd "$(dirname "$0")/.." && pwd)/.cache/promtool"
promtool="$(command -v promtool || true)"
if [ -z "$promtool" ]; then
  promtool="$cache/root/usr/bin/promtool"
  if [ ! -x "$promtool" ]; then
    rm -rf "$cache" && mkdir -p "$cache"
    (cd "$cache" && { apt-get download prometheus 2>/dev/null || { apt-get update -qq && apt-get download prometheus; }; } \
       && dpkg-deb -x prometheus_*.deb root && rm -f prometheus_*.deb) >/dev/null
  fi
fi
exec "$promtool" "$@"
