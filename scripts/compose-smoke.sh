#!/usr/bin/env bash
# Compose smoke test of the images (`make compose-test`, after `make images`): start etcd + rollout +
# inference (scripted) + gateway from deploy/compose.yaml with every port published on 127.0.0.1 (free
# host ports) and a fresh control-plane token, check each gRPC server is SERVING through grpcurl from the
# host, check OpenSession is refused without the token, open a gateway session with it and send one OpenAI
# chat completion through the gateway container, then SIGTERM the stack and check
# every container exited with code 0 (drained, not killed). Prints the duration of each step.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
GRPCURL="${GRPCURL:-$ROOT/.venv/bin/grpcurl}"
PROJECT="lodestar-smoke-$$"
COMPOSE=(docker-compose -f deploy/compose.yaml -p "$PROJECT")
STOP_TIMEOUT_S=30
t0=$(date +%s)
log() { echo "compose-smoke [$(( $(date +%s) - t0 )) s]: $*" >&2; }
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

for image in etcd rollout inference gateway; do
  docker image inspect "lodestar/$image:dev" >/dev/null 2>&1 || { log "image lodestar/$image:dev missing: run 'make images'"; exit 1; }
done
[[ -f build/compose/tiny-model/tokenizer.json ]] || "$ROOT/.venv/bin/lodestar" model init-tiny build/compose/tiny-model >/dev/null
chmod -R a+rX build/compose

export LODESTAR_ETCD_HOST_PORT=$(free_port) LODESTAR_ROLLOUT_HOST_PORT=$(free_port)
export LODESTAR_INFERENCE_HOST_PORT=$(free_port) LODESTAR_GATEWAY_HOST_PORT=$(free_port)
export LODESTAR_GATEWAY_HTTP_HOST_PORT=$(free_port)
# The services bind 0.0.0.0 in their containers: they need the control-plane token (and refuse to start without).
export LODESTAR_AUTH_TOKEN="$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')"

cleanup() {
  local code=$?
  if [[ $code -ne 0 ]]; then "${COMPOSE[@]}" logs --no-color --tail=60 >&2 || true; fi
  "${COMPOSE[@]}" down -v -t 5 >/dev/null 2>&1 || true
  exit $code
}
trap cleanup EXIT

log "starting the stack ($PROJECT)"
timeout 120 "${COMPOSE[@]}" up -d >/dev/null 2>&1

wait_serving() {  # NAME PORT
  local deadline=$(( $(date +%s) + 120 )) reply=""
  while (( $(date +%s) < deadline )); do
    reply="$(timeout 5 "$GRPCURL" -plaintext -max-time 3 "127.0.0.1:$2" grpc.health.v1.Health/Check 2>&1 || true)"
    if grep -q '"SERVING"' <<<"$reply"; then log "$1 SERVING on 127.0.0.1:$2"; return 0; fi
    sleep 1
  done
  log "$1 not SERVING on 127.0.0.1:$2 within 120 s: $reply"; return 1
}
wait_serving inference "$LODESTAR_INFERENCE_HOST_PORT"
wait_serving rollout "$LODESTAR_ROLLOUT_HOST_PORT"
wait_serving gateway "$LODESTAR_GATEWAY_HOST_PORT"
timeout 10 "$GRPCURL" -plaintext "127.0.0.1:$LODESTAR_ROLLOUT_HOST_PORT" list | grep -q lodestar.v1.RolloutService
timeout 10 curl -fsS "http://127.0.0.1:$LODESTAR_ETCD_HOST_PORT/health" | grep -q '"health":"true"'
log "etcd healthy; reflection lists RolloutService"

if timeout 10 "$GRPCURL" -plaintext -d '{}' "127.0.0.1:$LODESTAR_GATEWAY_HOST_PORT" \
  lodestar.v1.GatewayService/OpenSession >/dev/null 2>&1; then
  log "OpenSession without the token was answered: the gateway must refuse it"; exit 1
fi
session="$(timeout 10 "$GRPCURL" -plaintext -H "authorization: Bearer $LODESTAR_AUTH_TOKEN" \
  -d '{"labels": {"purpose": "compose-smoke"}}' \
  "127.0.0.1:$LODESTAR_GATEWAY_HOST_PORT" lodestar.v1.GatewayService/OpenSession)"
log "OpenSession refused without the token, answered with it"
key="$("$PY" -c 'import json,sys; print(json.load(sys.stdin)["session"]["sessionKey"])' <<<"$session")"
reply="$(timeout 60 curl -fsS "http://127.0.0.1:$LODESTAR_GATEWAY_HTTP_HOST_PORT/v1/chat/completions" \
  -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"model": "lodestar", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 32}')"
text="$("$PY" -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' <<<"$reply")"
[[ "$text" == "Hello from the scripted engine." ]] || { log "unexpected completion: $reply"; exit 1; }
log "chat completion through the gateway container: '$text'"

log "SIGTERM to every container (stop timeout ${STOP_TIMEOUT_S} s)"
s=$(date +%s)
timeout 120 "${COMPOSE[@]}" stop -t "$STOP_TIMEOUT_S" >/dev/null 2>&1
stopped=$(( $(date +%s) - s ))
failed=0
for id in $("${COMPOSE[@]}" ps -q); do
  read -r name code oom <<<"$(docker inspect -f '{{.Name}} {{.State.ExitCode}} {{.State.OOMKilled}}' "$id")"
  log "$name exited with code $code (oom killed: $oom)"
  [[ "$code" == 0 && "$oom" == false ]] || failed=1
done
(( stopped < STOP_TIMEOUT_S )) || { log "stop took ${stopped} s: something ignored SIGTERM"; failed=1; }
[[ $failed -eq 0 ]] || { log "FAILED: a container did not exit cleanly"; exit 1; }
log "PASSED (stack stopped in ${stopped} s)"
