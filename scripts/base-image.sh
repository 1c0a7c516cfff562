#!/usr/bin/env bash
# Prints the name of the Debian base image lodestar's images build FROM, building it first when missing:
# BASE=<image> is used as given (e.g. python:3.11-slim where a registry is reachable); by default a Debian
# bookworm minbase with python3 + venv is built with debootstrap, offline from any container registry,
# and imported as local/lodestar-base:bookworm (once). Used by scripts/images.sh and scripts/session-image.sh.
set -euo pipefail

if [[ -n "${BASE:-}" ]]; then echo "$BASE"; exit 0; fi
BASE="local/lodestar-base:bookworm"
docker info >/dev/null 2>&1 || { echo "base-image: no Docker daemon (make docker-deps starts one)" >&2; exit 1; }
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  echo "base-image: building $BASE with debootstrap" >&2
  rootfs="$(mktemp -d /tmp/lodestar-rootfs.XXXXXX)"
  trap 'rm -rf "$rootfs"' EXIT
  mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
  timeout 900 debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >/dev/null
  # The host's apt sources and settings (its mirror, proxy settings) replace debootstrap's sources.list.
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then rm -f "$rootfs/etc/apt/sources.list"; fi
  cp -r /etc/apt/sources.list.d/. "$rootfs/etc/apt/sources.list.d/" 2>/dev/null || true
  if [[ -f /etc/apt/sources.list ]]; then cp /etc/apt/sources.list "$rootfs/etc/apt/"; fi
  for conf in /etc/apt/apt.conf.d/*; do if [[ -f "$conf" ]]; then cp "$conf" "$rootfs/etc/apt/apt.conf.d/"; fi; done
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import - "$BASE" >/dev/null
fi
echo "$BASE"
