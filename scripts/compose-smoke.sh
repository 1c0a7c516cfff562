#!/usr/bin/env bash
# Compose smoke test of the images (`make compose-test`, after `make images`): start etcd (TLS, client
# certificates, auth with a role per key kind) + rollout + inference (scripted) + gateway from
# deploy/compose.yaml with every port published on 127.0.0.1 (free host ports) and fresh credentials per
# role, check each gRPC server is SERVING through grpcurl from the host, check OpenSession is refused
# without a token and with the gateway node's, open a gateway session with the operator's and send one
# OpenAI chat completion through the gateway container, check the gateway's etcd user cannot register an
# inference replica, then SIGTERM the stack and check every container exited with code 0 (drained, not
# killed). Prints the duration of each step.
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
# Fresh credentials per role (deploy/compose-credentials.sh, the stack's one-shot `credentials` service).
CREDENTIALS="$ROOT/build/compose/credentials"
rm -rf "$CREDENTIALS" && mkdir -p "$CREDENTIALS"

cleanup() {
  local code=$?
  if [[ $code -ne 0 ]]; then "${COMPOSE[@]}" logs --no-color --tail=60 >&2 || true; fi
  "${COMPOSE[@]}" down -v -t 5 >/dev/null 2>&1 || true
  docker run --rm -v "$CREDENTIALS:/c" --user 0 --entrypoint sh lodestar/rollout:dev -c 'rm -rf /c/*' >/dev/null 2>&1 || true
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
ETCDCTL=(timeout 10 "${COMPOSE[@]}" exec -T etcd etcdctl --endpoints=https://127.0.0.1:2379 --cacert=/credentials/ca.pem)
"${ETCDCTL[@]}" --cert=/credentials/client.pem --key=/credentials/client-key.pem endpoint health >/dev/null
log "etcd healthy over TLS; reflection lists RolloutService"
OPERATOR_TOKEN="$(cat "$CREDENTIALS/operator/operator.token")"

if timeout 10 "$GRPCURL" -plaintext -d '{}' "127.0.0.1:$LODESTAR_GATEWAY_HOST_PORT" \
  lodestar.v1.GatewayService/OpenSession >/dev/null 2>&1; then
  log "OpenSession without the token was answered: the gateway must refuse it"; exit 1
fi
NODE_TOKEN="$(timeout 10 "${COMPOSE[@]}" exec -T gateway cat /credentials/node.token)"
if timeout 10 "$GRPCURL" -plaintext -d '{}' -H "authorization: Bearer $NODE_TOKEN" \
  "127.0.0.1:$LODESTAR_GATEWAY_HOST_PORT" lodestar.v1.GatewayService/OpenSession >/dev/null 2>&1; then
  log "OpenSession with the gateway node's token was answered: only the operator's may"; exit 1
fi
session="$(timeout 10 "$GRPCURL" -plaintext -H "authorization: Bearer $OPERATOR_TOKEN" \
  -d '{"labels": {"purpose": "compose-smoke"}}' \
  "127.0.0.1:$LODESTAR_GATEWAY_HOST_PORT" lodestar.v1.GatewayService/OpenSession)"
log "OpenSession refused without a token and with the node's, answered with the operator's"
key="$("$PY" -c 'import json,sys; print(json.load(sys.stdin)["session"]["sessionKey"])' <<<"$session")"
reply="$(timeout 60 curl -fsS "http://127.0.0.1:$LODESTAR_GATEWAY_HTTP_HOST_PORT/v1/chat/completions" \
  -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"model": "lodestar", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 32}')"
text="$("$PY" -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' <<<"$reply")"
[[ "$text" == "Hello from the scripted engine." ]] || { log "unexpected completion: $reply"; exit 1; }
log "chat completion through the gateway container: '$text'"
# The gateway's etcd user writes node keys only: a forged inference replica is refused.
if timeout 10 "${COMPOSE[@]}" exec -T gateway python -c '
import asyncio
from lodestar.etcd import EtcdClient, EtcdTls
async def forge():
    tls = EtcdTls("/credentials/ca.pem", "/credentials/gateway.pem", "/credentials/gateway-key.pem")
    async with EtcdClient("https://etcd:2379", tls=tls) as etcd:
        await etcd.put("/lodestar/inference/forged", "{}")
asyncio.run(forge())' >/dev/null 2>&1; then
  log "the gateway's etcd user registered an inference replica: etcd roles are not on"; exit 1
fi
log "etcd refused a replica key from the gateway's user"

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
