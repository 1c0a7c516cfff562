#!/usr/bin/env bash
# Builds the per-service images (etcd, rollout, inference CPU, gateway) with the local Docker daemon,
# offline from any container registry. `make images` calls it; `make compose-test` then runs them.
#
# 1. Base: scripts/base-image.sh (BASE=<image> as given, e.g. python:3.11-slim where a registry is
#    reachable; by default a Debian bookworm minbase with python3 + venv built with debootstrap and imported
#    as local/lodestar-base:bookworm, once).
# 2. Wheelhouse: every Python package of the images (and lodestar itself) is built on the host into
#    build/images/wheels with `pip wheel` (again only when pyproject.toml or the sources changed); each
#    image's context build/images/<service> gets just the wheels of its own extra, and the image installs
#    them with --no-index: reproducible, no package index needed.
# 3. The gateway's context also gets the host's node binary and .harnesses (scripts/install-harnesses.sh,
#    pinned by harnesses/package-lock.json), as hard links.
# 4. docker build (classic builder, DOCKER_BUILDKIT=0) of deploy/Dockerfile.<service> as lodestar/<service>:$TAG.
#
# Environment: BASE, TAG (default dev), SERVICES (default "etcd rollout inference gateway"), PYTHON.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TAG="${TAG:-dev}"
SERVICES="${SERVICES:-etcd rollout inference gateway}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
STAGE="$ROOT/build/images"
export DOCKER_BUILDKIT=0
declare -A EXTRA=([rollout]=rollout [inference]=inference [gateway]=gateway [trainer]=trainer)

log() { echo "images [$(( $(date +%s) - t0 )) s]: $*" >&2; }
t0=$(date +%s)

docker info >/dev/null 2>&1 || { log "no Docker daemon (make docker-deps starts one)"; exit 1; }

BASE="$(bash "$ROOT/scripts/base-image.sh")"
log "base image: $BASE"

mkdir -p "$STAGE/wheels"
want="$(sha256sum pyproject.toml | cut -c1-16)-$(git ls-files -s lodestar lodestar_app services | sha256sum | cut -c1-16)"
if [[ "$(cat "$STAGE/wheels/.stamp" 2>/dev/null)" != "$want" ]]; then
  log "building the wheelhouse"
  rm -f "$STAGE"/wheels/lodestar-*.whl "$STAGE"/wheels/lodestar_*.whl
  timeout 1800 "$PYTHON" -m pip wheel -q --disable-pip-version-check -w "$STAGE/wheels" \
    '.[gateway,rollout,inference]' ./services/gateway ./services/rollout ./services/inference 2>&1 \
    | grep -v "^WARNING: Location" >&2 || true
  echo "$want" > "$STAGE/wheels/.stamp"
fi
log "wheelhouse: $(ls "$STAGE/wheels" | wc -l) wheels, $(du -sh "$STAGE/wheels" | cut -f1)"

for service in $SERVICES; do
  context="$STAGE/$service"
  rm -rf "$context" && mkdir -p "$context"
  if [[ -n "${EXTRA[$service]:-}" ]]; then
    timeout 600 "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-index --find-links "$STAGE/wheels" \
      -w "$context/wheels" "lodestar[${EXTRA[$service]}]" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  fi
  if [[ "$service" == gateway ]]; then
    bash scripts/install-harnesses.sh >&2
    cp -f "$(command -v node)" "$context/node"
    cp -al "$ROOT/.harnesses" "$context/harnesses"
  fi
  s=$(date +%s)
  log "building lodestar/$service:$TAG (context $(du -sh "$context" | cut -f1))"
  if ! timeout 1800 docker build -f "deploy/Dockerfile.$service" --build-arg "BASE=$BASE" -t "lodestar/$service:$TAG" \
      "$context" >"$STAGE/$service.log" 2>&1; then
    tail -40 "$STAGE/$service.log" >&2
    log "building lodestar/$service:$TAG failed (full log: $STAGE/$service.log)"
    exit 1
  fi
  size=$(docker image inspect -f '{{.Size}}' "lodestar/$service:$TAG")
  log "lodestar/$service:$TAG built in $(( $(date +%s) - s )) s, $(( size / 1000000 )) MB"
done
log "done"
