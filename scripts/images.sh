#!/usr/bin/env bash
# Builds the per-service images with the local Docker daemon, offline from any container registry.
# `make images` calls it (etcd, rollout, inference CPU, gateway); `make compose-test` then runs them.
#
#   bash scripts/images.sh [--download] [--stage-only]
#
# 1. Base: scripts/base-image.sh (BASE=<image> as given, e.g. python:3.11-slim where a registry is
#    reachable; by default a Debian bookworm minbase with python3 + venv built with debootstrap and imported
#    as local/lodestar-base:bookworm, once).
# 2. Wheelhouse: every Python package of the CPU images (and lodestar itself) is built on the host into
#    build/images/wheels with `pip wheel` (again only when pyproject.toml or the sources changed); each
#    image's context build/images/<service> gets just the wheels of its own extra, and the image installs
#    them with --no-index: reproducible, no package index needed.
# 3. The GPU images (SERVICES="inference-cuda trainer": deploy/Dockerfile.inference-cuda, `lodestar[inference,
#    vllm]`; deploy/Dockerfile.trainer, `lodestar[trainer]`) take their wheels from a second wheelhouse,
#    GPU_WHEELS (default build/images/wheels-cuda), which must hold vLLM and the CUDA build of torch (several
#    GB, for GPU_PYTHON_VERSION/GPU_PLATFORM). With --download (or DOWNLOAD=1) the missing wheels are fetched
#    into it from GPU_INDEX_URL (default PyPI) and nothing else (this machine's pip configuration, its
#    find-links and constraints, is not used: its CPU torch must not stand in for the CUDA one); without it,
#    a wheelhouse that lacks them stops the script with the missing requirement named. lodestar's own wheels
#    (pure Python) are built into build/images/own. A torch wheel with a +cpu local version is refused.
# 4. The gateway's context also gets the host's node binary and .harnesses (scripts/install-harnesses.sh,
#    pinned by harnesses/package-lock.json), as hard links.
# 5. docker build (classic builder, DOCKER_BUILDKIT=0) of deploy/Dockerfile.<service> as lodestar/<service>:$TAG.
#    --stage-only (or STAGE_ONLY=1) stops after staging the contexts: no Docker daemon needed, e.g. to build
#    the GPU images elsewhere with `docker build -f deploy/Dockerfile.<service> build/images/<service>`.
#
# Environment: BASE, TAG (default dev), SERVICES (default "etcd rollout inference gateway"), PYTHON, STAGE
# (default build/images), DOWNLOAD, STAGE_ONLY, GPU_WHEELS, GPU_INDEX_URL, GPU_PYTHON_VERSION (default 3.11),
# GPU_PLATFORM (default manylinux_2_28_x86_64).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
for arg in "$@"; do
  case "$arg" in
    --download) DOWNLOAD=1 ;;
    --stage-only) STAGE_ONLY=1 ;;
    *) echo "images: unknown argument $arg (--download, --stage-only)" >&2; exit 2 ;;
  esac
done
TAG="${TAG:-dev}"
SERVICES="${SERVICES:-etcd rollout inference gateway}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
STAGE="${STAGE:-$ROOT/build/images}"
DOWNLOAD="${DOWNLOAD:-0}"
STAGE_ONLY="${STAGE_ONLY:-0}"
GPU_WHEELS="${GPU_WHEELS:-$STAGE/wheels-cuda}"
GPU_INDEX_URL="${GPU_INDEX_URL:-https://pypi.org/simple}"
GPU_PYTHON_VERSION="${GPU_PYTHON_VERSION:-3.11}"
GPU_PLATFORM="${GPU_PLATFORM:-manylinux_2_28_x86_64}"
export DOCKER_BUILDKIT=0
declare -A EXTRA=([rollout]=rollout [inference]=inference [gateway]=gateway [trainer]=trainer
                  [inference-cuda]=inference,vllm)
declare -A GPU=([inference-cuda]=1 [trainer]=1)
PIP=("$PYTHON" -m pip --disable-pip-version-check)

log() { echo "images [$(( $(date +%s) - t0 )) s]: $*" >&2; }
t0=$(date +%s)
for service in $SERVICES; do
  [[ -f "deploy/Dockerfile.$service" ]] || { log "no deploy/Dockerfile.$service"; exit 2; }
done
cpu_services="" gpu_services=""  # those that need the CPU or the GPU wheelhouse
for service in $SERVICES; do
  if [[ -n "${GPU[$service]:-}" ]]; then gpu_services+=" $service"; elif [[ -n "${EXTRA[$service]:-}" ]]; then cpu_services+=" $service"; fi
done
sources="$(sha256sum pyproject.toml | cut -c1-16)-$(git ls-files -s lodestar lodestar_app services | sha256sum | cut -c1-16)"

if [[ "$STAGE_ONLY" != 1 ]]; then
  docker info >/dev/null 2>&1 || { log "no Docker daemon (make docker-deps starts one)"; exit 1; }
  BASE="$(bash "$ROOT/scripts/base-image.sh")"
  log "base image: $BASE"
fi

cpu_wheelhouse() {
  mkdir -p "$STAGE/wheels"
  if [[ "$(cat "$STAGE/wheels/.stamp" 2>/dev/null)" != "$sources" ]]; then
    log "building the wheelhouse"
    rm -f "$STAGE"/wheels/lodestar-*.whl "$STAGE"/wheels/lodestar_*.whl
    timeout 1800 "${PIP[@]}" wheel -q -w "$STAGE/wheels" \
      '.[gateway,rollout,inference]' ./services/gateway ./services/rollout ./services/inference 2>&1 \
      | grep -v "^WARNING: Location" >&2 || true
    echo "$sources" > "$STAGE/wheels/.stamp"
  fi
  log "wheelhouse: $(ls "$STAGE/wheels" | wc -l) wheels, $(du -sh "$STAGE/wheels" | cut -f1)"
}

own_wheels() {  # lodestar's five pure-Python wheels, nothing else (the GPU wheelhouse resolves against them)
  if [[ "$(cat "$STAGE/own/.stamp" 2>/dev/null)" != "$sources" ]]; then
    rm -rf "$STAGE/own" && mkdir -p "$STAGE/own"
    timeout 600 "${PIP[@]}" wheel -q --no-deps --no-build-isolation -w "$STAGE/own" \
      . ./services/gateway ./services/rollout ./services/inference ./services/trainer 2>&1 \
      | grep -v "^WARNING: Location" >&2 || true
    echo "$sources" > "$STAGE/own/.stamp"
  fi
}

# pip for the GPU target: wheels only, for GPU_PYTHON_VERSION on GPU_PLATFORM, without this machine's pip configuration.
GPU_PIP=(env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT -u PIP_NO_INDEX
         PIP_CONFIG_FILE=/dev/null "${PIP[@]}" download -q --only-binary=:all: --implementation cp
         --python-version "$GPU_PYTHON_VERSION" --platform "$GPU_PLATFORM" --find-links "$STAGE/own")

stage_gpu() {  # SERVICE CONTEXT: the closure of the service's extra from the GPU wheelhouse, or a clear refusal
  local service="$1" context="$2" requirement="lodestar[${EXTRA[$1]}]" errors
  mkdir -p "$GPU_WHEELS" "$context/wheels"
  errors="$(mktemp)"
  if ! timeout 600 "${GPU_PIP[@]}" --no-index --find-links "$GPU_WHEELS" -d "$context/wheels" "$requirement" 2>"$errors"; then
    if [[ "$DOWNLOAD" != 1 ]]; then
      grep -E "^ERROR" "$errors" | head -5 >&2 || tail -5 "$errors" >&2
      rm -f "$errors"
      log "the GPU wheelhouse $GPU_WHEELS cannot install $requirement for Python $GPU_PYTHON_VERSION on" \
        "$GPU_PLATFORM (above: what is missing). It needs vLLM and the CUDA build of torch, several GB:" \
        "rerun with --download (or DOWNLOAD=1) to fetch them from $GPU_INDEX_URL, or put the wheels there"
      exit 1
    fi
    log "downloading the wheels of $requirement into $GPU_WHEELS from $GPU_INDEX_URL (several GB)"
    timeout 3600 "${GPU_PIP[@]}" --index-url "$GPU_INDEX_URL" --find-links "$GPU_WHEELS" -d "$GPU_WHEELS" "$requirement" >&2
    timeout 600 "${GPU_PIP[@]}" --no-index --find-links "$GPU_WHEELS" -d "$context/wheels" "$requirement" >&2
  fi
  rm -f "$errors"
  if compgen -G "$context/wheels/torch-*+cpu*.whl" >/dev/null; then
    log "$service: the GPU wheelhouse resolved a CPU build of torch ($(basename "$context"/wheels/torch-*+cpu*.whl)):" \
      "remove it from $GPU_WHEELS and rerun with --download"
    exit 1
  fi
  if [[ "$service" == inference-cuda ]] && ! compgen -G "$context/wheels/vllm-*.whl" >/dev/null; then
    log "$service: no vllm wheel was staged"; exit 1
  fi
}

if [[ -n "$cpu_services" ]]; then cpu_wheelhouse; fi
if [[ -n "$gpu_services" ]]; then own_wheels; fi

for service in $SERVICES; do
  context="$STAGE/$service"
  rm -rf "$context" && mkdir -p "$context"
  if [[ -n "${GPU[$service]:-}" ]]; then
    stage_gpu "$service" "$context"
  elif [[ -n "${EXTRA[$service]:-}" ]]; then
    timeout 600 "${PIP[@]}" wheel -q --no-index --find-links "$STAGE/wheels" \
      -w "$context/wheels" "lodestar[${EXTRA[$service]}]" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  fi
  if [[ "$service" == gateway ]]; then
    bash scripts/install-harnesses.sh >&2
    cp -f "$(command -v node)" "$context/node"
    cp -al "$ROOT/.harnesses" "$context/harnesses"
  fi
  if [[ "$STAGE_ONLY" == 1 ]]; then
    log "staged $context ($(find "$context/wheels" -name '*.whl' 2>/dev/null | wc -l) wheels, $(du -sh "$context" | cut -f1))"
    continue
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
