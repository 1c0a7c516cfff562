"""The credentials of one torch.distributed weight broadcast (lodestar_trainer/weights/broadcast.py sends,
services/inference/lodestar_inference/broadcast.py receives), as pure functions over bytes.

c10d's TCPStore has no authentication: whoever reaches its port can list, read and write every key
(`list_keys`), so a group name is no secret and a stranger can take a rank in a group. The trainer therefore
sends each replica a fresh random secret over the authenticated gRPC control plane (`WeightsBroadcast.secret`),
and the two ranks of a group use it before and after the data:

1. rank 0 broadcasts a nonce n0; rank 1 answers its own nonce n1 and `proof(secret, "replica", group, n0)`;
2. rank 0 checks it (a stranger in rank 1's place gets no weight byte), then broadcasts
   `proof(secret, "trainer", group, n1)`, which rank 1 checks (a stranger in rank 0's place sends nothing it
   would keep);
3. after the buckets rank 0 broadcasts `data_mac(...)` over every data byte, which rank 1 checks before the
   payload goes anywhere (bytes changed on the way are refused).

What this does not give: the bytes travel in clear (gloo has no encryption), so anyone who can read the
network between trainer and replicas can read the weights.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Literal

from lodestar.errors import InvalidArgumentError

SECRET_BYTES = 32
NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def check_secret(secret: bytes) -> bytes:
    """`secret` when it is long enough; InvalidArgumentError otherwise (a sender without one is refused)."""
    if len(secret) < SECRET_BYTES:
        raise InvalidArgumentError(
            f"weight broadcast: the push's secret must be at least {SECRET_BYTES} bytes (a trainer that sends "
            "none is older than this replica: update it, or use the grpc transport)"
        )
    return secret


def proof(secret: bytes, role: Literal["trainer", "replica"], group: str, nonce: bytes) -> bytes:
    """What `role` answers to the other rank's `nonce` in `group`: HMAC-SHA256 under the push's secret."""
    return hmac.new(
        secret, b"\0".join([b"lodestar-weights-proof", role.encode(), group.encode(), nonce]), "sha256"
    ).digest()


def data_mac(secret: bytes, group: str, nonces: tuple[bytes, bytes]) -> hmac.HMAC:
    """The running MAC of the data section of one group's transfer (feed it each bucket in order)."""
    return hmac.new(secret, b"\0".join([b"lodestar-weights-data", group.encode(), *nonces]), "sha256")


def same(expected: bytes, received: bytes) -> bool:
    return hmac.compare_digest(expected, received)
