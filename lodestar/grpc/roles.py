"""Who may call what on the control plane: the roles, the one table of which roles may call each RPC, and
the token table a server checks callers against (docs/security.md, "Credentials per role").

Roles:

- `node`: a gateway node. It pulls and reports its own sessions (AcquireSessions, CompleteSession; the
  acquire loop is its heartbeat). A token `node:<node_id>` is bound to that node: the rollout servicer
  refuses a request naming another node with PERMISSION_DENIED (`check_node`). A plain `node` token is
  shared by nodes that cannot hold credentials of their own (one Kubernetes Deployment) and may name any.
- `trainer`: reads groups (StreamGroups), reports the policy version it published and pushes weights
  (UpdateWeights).
- `operator`: a person or the CLI: creates, cancels, deletes and archives runs, reads everything the
  dashboard shows, opens sessions on a gateway, and controls the trainer.
- `inference`: an inference replica. It calls no control-plane RPC; its credential is its etcd user
  (`lodestar etcd setup-auth`), which may write only its own registration key.

A token table is a text file with one `role[:identity] token` line per credential (`operator,trainer`
gives one token two roles: an operator whose `lodestar train` starts a trainer); `#` starts a comment.
The token may be given as `sha256:<hex>` (its SHA-256), so a server can check tokens without holding
them (`lodestar auth tokens` writes both forms). The single `auth_token` setting without a table is one
token with every role and no identity (a laptop's `lodestar up`).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lodestar.errors import InvalidArgumentError

PROTECTED_PREFIX = "/lodestar."
"""Every method of a lodestar service needs a token (when the server has any), unless it is open."""


class Role(enum.StrEnum):
    OPERATOR = "operator"
    TRAINER = "trainer"
    NODE = "node"
    INFERENCE = "inference"


OPERATOR, TRAINER, NODE = Role.OPERATOR, Role.TRAINER, Role.NODE
_ROLLOUT, _INFERENCE, _GATEWAY, _TRAINER = (
    "/lodestar.v1.RolloutService/",
    "/lodestar.v1.InferenceService/",
    "/lodestar.v1.GatewayService/",
    "/lodestar.v1.TrainerService/",
)

OPEN_METHODS = frozenset(
    {
        # Generation and what a client needs to format it: the data plane the gateway proxies. It reads no
        # session, run, group, weights or checkpoint (the policy version is public), and a NetworkPolicy
        # keeps it to the gateway and the trainer in a deployment.
        _INFERENCE + "Generate",
        _INFERENCE + "GenerateMany",
        _INFERENCE + "CountTokens",
        _INFERENCE + "GetModelInfo",
        # Aggregate counters of a node (no session ids or keys): a status page.
        _GATEWAY + "GetNodeStatus",
    }
)
"""The lodestar methods that stay open with tokens configured. Health and reflection (grpc.*) are not
lodestar methods and are always open."""

METHOD_ROLES: Mapping[str, frozenset[Role]] = {
    # Runs: an operator's. The trainer reads groups and reports the version it published.
    _ROLLOUT + "CreateRun": frozenset({OPERATOR}),
    _ROLLOUT + "GetRun": frozenset({OPERATOR}),
    _ROLLOUT + "CancelRun": frozenset({OPERATOR}),
    _ROLLOUT + "DeleteRun": frozenset({OPERATOR}),
    _ROLLOUT + "ArchiveRun": frozenset({OPERATOR}),
    _ROLLOUT + "ListRuns": frozenset({OPERATOR}),
    _ROLLOUT + "ListGroups": frozenset({OPERATOR}),
    _ROLLOUT + "GetSessionDetail": frozenset({OPERATOR}),
    _ROLLOUT + "ListFailedAttempts": frozenset({OPERATOR}),
    _ROLLOUT + "StreamGroups": frozenset({TRAINER, OPERATOR}),  # `lodestar eval` reads groups too
    _ROLLOUT + "ReportPolicyVersion": frozenset({TRAINER}),
    # A node's own sessions (the node id of the request must be the token's: `check_node`).
    _ROLLOUT + "AcquireSessions": frozenset({NODE}),
    _ROLLOUT + "CompleteSession": frozenset({NODE}),
    # Weights: only the trainer changes the policy.
    _INFERENCE + "UpdateWeights": frozenset({TRAINER}),
    # Sessions opened by hand on a gateway (`lodestar session`).
    _GATEWAY + "OpenSession": frozenset({OPERATOR}),
    _GATEWAY + "CloseSession": frozenset({OPERATOR}),
    _GATEWAY + "GetSession": frozenset({OPERATOR}),
    # The trainer's control: an operator's.
    _TRAINER + "GetStatus": frozenset({OPERATOR}),
    _TRAINER + "StreamMetrics": frozenset({OPERATOR}),
    _TRAINER + "SaveCheckpoint": frozenset({OPERATOR}),
    _TRAINER + "Stop": frozenset({OPERATOR}),
}
"""Which roles may call each protected method. Deny by default: a lodestar method in neither this table
nor `OPEN_METHODS` is refused to every role-bound token (only an all-roles token passes)."""


def needs_token(method: str) -> bool:
    """Whether `method` ("/pkg.Service/Method") needs a token: every lodestar method but `OPEN_METHODS`;
    health and reflection (grpc.*) never do."""
    return method.startswith(PROTECTED_PREFIX) and method not in OPEN_METHODS


@dataclass(frozen=True)
class Principal:
    """Who a token says the caller is: its roles and, for a node, the node id it is bound to."""

    roles: frozenset[Role]
    identity: str | None = None

    @property
    def name(self) -> str:
        if self.roles == frozenset(Role):
            return "all roles"
        role = ",".join(sorted(self.roles))
        return f"{role}:{self.identity}" if self.identity else role

    def may_call(self, method: str) -> bool:
        if self.roles == frozenset(Role):
            return True
        return bool(self.roles & METHOD_ROLES.get(method, frozenset()))


ALL_ROLES = Principal(frozenset(Role))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenTable:
    """The tokens a server accepts, each mapped to its principal (kept as SHA-256 digests)."""

    def __init__(self, entries: Mapping[bytes, Principal]) -> None:
        if not entries:
            raise InvalidArgumentError("the token table is empty")
        self._entries = dict(entries)

    @classmethod
    def all_roles(cls, token: str) -> TokenTable:
        """One token with every role (the single `auth_token`)."""
        return cls({_digest(token): ALL_ROLES})

    @classmethod
    def parse(cls, text: str, *, source: str = "token table") -> TokenTable:
        """`role[:identity] token` lines (token may be `sha256:<hex>`); InvalidArgumentError naming the line."""
        entries: dict[bytes, Principal] = {}
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            where = f"{source} line {number}"
            if len(fields) != 2:
                raise InvalidArgumentError(f"{where}: expected 'role[:identity] token'")
            principal, digest = _principal(fields[0], where), _token_digest(fields[1], where)
            if digest in entries:
                raise InvalidArgumentError(f"{where}: the same token is given twice")
            entries[digest] = principal
        return cls(entries)

    @classmethod
    def read(cls, path: Path) -> TokenTable:
        try:
            text = path.read_text()
        except OSError as error:
            raise InvalidArgumentError(f"cannot read token table {path}: {error.strerror}") from error
        return cls.parse(text, source=str(path))

    def principal(self, token: bytes) -> Principal | None:
        """The principal of a presented token, or None for an unknown one. Looked up by the token's SHA-256:
        what a lookup's timing could tell is about digests, from which no token can be recovered."""
        return self._entries.get(hashlib.sha256(token).digest())


def _principal(field: str, where: str) -> Principal:
    """`role[,role...][:identity]`, or `all` (every role)."""
    names, _, identity = field.partition(":")
    if names == "all":
        return ALL_ROLES
    roles: set[Role] = set()
    for name in names.split(","):
        try:
            roles.add(Role(name))
        except ValueError:
            known = ", ".join(role.value for role in Role)
            raise InvalidArgumentError(f"{where}: unknown role {name!r} (one of {known}, or all)") from None
    if NODE in roles and len(roles) > 1:
        raise InvalidArgumentError(f"{where}: a node token has the node role alone")
    return Principal(frozenset(roles), identity or None)


def _token_digest(field: str, where: str) -> bytes:
    if field.startswith("sha256:"):
        try:
            digest = bytes.fromhex(field.removeprefix("sha256:"))
        except ValueError:
            digest = b""
        if len(digest) != hashlib.sha256().digest_size:
            raise InvalidArgumentError(f"{where}: sha256: needs 64 hex digits")
        return digest
    if len(field) < 16:
        raise InvalidArgumentError(f"{where}: a token needs at least 16 characters")
    return _digest(field)


def token_line(role: str, token: str, *, hashed: bool) -> str:
    """One table line for `role` ("node:gw-1") and its token, plain or as its SHA-256."""
    value = f"sha256:{hashlib.sha256(token.encode()).hexdigest()}" if hashed else token
    return f"{role} {value}"
