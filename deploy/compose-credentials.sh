#!/bin/sh
# The compose stack's credentials (deploy/compose.yaml, service `credentials`, run once before the others):
# a local CA with a certificate per service, etcd and the operator's client (`lodestar auth pki`), tokens per
# role (`lodestar auth tokens`), and one directory per service holding only what that service needs:
#   etcd/       its server certificate, the CA, the client certificate of its health check
#   rollout/    the CA, its etcd client certificate (CN lodestar-rollout), the servers' token digests
#   inference/  the token digests
#   gateway/    the CA, its etcd client certificate (CN lodestar-gateway), the digests, the shared node token
#   setup/      the CA and the client certificate that runs `lodestar etcd setup-auth` once
#   operator/   the operator's token (for `lodestar run ... --auth-token-file` on the host)
# Existing files are kept (a restart reuses them). Runs as root in the rollout image; the services' files go
# to uid 10001 (every service and etcd run as it here), the operator's to the owner of the mounted directory.
set -eu
C="${1:-/credentials}"
lodestar auth pki "$C/pki" >/dev/null
lodestar auth tokens "$C/tokens" >/dev/null
give() {  # DIR FILE...
  dir="$C/$1"; shift
  mkdir -p "$dir"
  for file in "$@"; do cp "$file" "$dir/"; done
}
give etcd "$C/pki/ca.pem" "$C/pki/etcd.pem" "$C/pki/etcd-key.pem" "$C/pki/client.pem" "$C/pki/client-key.pem"
give rollout "$C/pki/ca.pem" "$C/pki/rollout.pem" "$C/pki/rollout-key.pem" "$C/tokens/tokens.sha256"
give inference "$C/tokens/tokens.sha256"
give gateway "$C/pki/ca.pem" "$C/pki/gateway.pem" "$C/pki/gateway-key.pem" "$C/tokens/tokens.sha256" "$C/tokens/node.token"
give setup "$C/pki/ca.pem" "$C/pki/client.pem" "$C/pki/client-key.pem"
give operator "$C/tokens/operator.token"
chown -R 10001:10001 "$C/etcd" "$C/rollout" "$C/inference" "$C/gateway" "$C/setup"
chown -R "$(stat -c %u:%g "$C")" "$C/operator"
chmod 0700 "$C/pki" "$C/tokens"
