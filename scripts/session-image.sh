#!/usr/bin/env bash
# Builds lodestar/session-base:$TAG (deploy/Dockerfile.session-base) FROM the debootstrap base of
# scripts/base-image.sh, offline from any container registry (apt comes from the host's mirror). Prints the
# image name. Skips the build when the image exists and the Dockerfile has not changed (FORCE=1 rebuilds).
# Environment: TAG (default dev), BASE (see scripts/base-image.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TAG="${TAG:-dev}"
IMAGE="lodestar/session-base:$TAG"
DOCKERFILE="$ROOT/deploy/Dockerfile.session-base"
export DOCKER_BUILDKIT=0
want="$(sha256sum "$DOCKERFILE" | cut -c1-16)"
have="$(docker image inspect -f '{{index .Config.Labels "lodestar.dockerfile"}}' "$IMAGE" 2>/dev/null || true)"
if [[ "$have" == "$want" && -z "${FORCE:-}" ]]; then echo "$IMAGE"; exit 0; fi
BASE="$(bash "$ROOT/scripts/base-image.sh")"
context="$(mktemp -d /tmp/lodestar-session-image.XXXXXX)"
trap 'rm -rf "$context"' EXIT
s=$(date +%s)
echo "session-image: building $IMAGE from $BASE" >&2
if ! timeout 1200 docker build -q -f "$DOCKERFILE" --build-arg "BASE=$BASE" --label "lodestar.dockerfile=$want" \
    -t "$IMAGE" "$context" >"$context/build.log" 2>&1; then
  tail -30 "$context/build.log" >&2
  echo "session-image: building $IMAGE failed" >&2
  exit 1
fi
echo "session-image: $IMAGE built in $(( $(date +%s) - s )) s" >&2
echo "$IMAGE"
