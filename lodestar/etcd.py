"""The etcd wrapper: the only module that imports the etcd client (`aetcd`).

It owns a small typed API over one etcd endpoint — key/value, leases with a keepalive task, prefix
watches and guarded transactions — and maps every client failure to `lodestar.errors`: etcd down or not
answering within the timeout is `UnavailableError`, an expired lease is `NotFoundError`, a watch from a
compacted revision is `WatchCompactedError`. No `aetcd` type leaves this module.

    async with EtcdClient("http://127.0.0.1:2379") as etcd:
        lease = await etcd.grant_lease(10)           # refreshed every TTL/3 by one task
        await etcd.put("/nodes/a", "up", lease=lease)
        async with await etcd.watch_prefix("/nodes/") as watch:
            async for event in watch: ...

Keys are text; values are bytes (text is UTF-8 encoded). Every RPC runs under the client's
`timeout`; blocking waits (watch iteration) take their own. Leader election lives in `lodestar.election`.

Transport (`lodestar.etcd_transport`): `http://` endpoints are plaintext (local etcd on loopback), `https://`
ones TLS (`EtcdTls`; with etcd's `--client-cert-auth` the certificate's CN is the etcd user: no password, no
expiring token). `apply_auth` sets up the users and roles of `lodestar.etcd_roles` and turns auth on.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar

import aetcd
import aetcd.rpc
import aetcd.watcher
import grpc
import grpc.aio

from lodestar import errors
from lodestar.etcd_roles import EtcdRole
from lodestar.etcd_transport import EtcdTls, channel_address, endpoints_of, tls_from_settings
from lodestar.logging import get_logger

DEFAULT_TIMEOUT_S = 5.0
T = TypeVar("T")
_log = get_logger("etcd")
_CHANNEL_OPTIONS: dict[str, int | str] = {
    # Reconnect quickly after etcd restarts (gRPC's default backoff grows to two minutes).
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.min_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 2000,
    # Detect a dead connection under a long-lived watch (etcd accepts pings every 5 s or slower).
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.http2.max_pings_without_data": 0,
}
_TLS_FAILURES = ("TSI_", "SSL", "andshake")
"""What gRPC's UNAVAILABLE details contain when the TLS handshake with etcd failed."""
_ERROR_BY_CODE: dict[grpc.StatusCode, type[errors.LodestarError]] = {
    grpc.StatusCode.NOT_FOUND: errors.NotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhaustedError,
    grpc.StatusCode.UNAUTHENTICATED: errors.UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: errors.UnauthenticatedError,
}


class WatchCompactedError(errors.FailedPreconditionError):
    """A watch asked for history etcd has compacted away; list again and watch from the new revision."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class EventKind(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True)
class KeyValue:
    """One key as stored: `version` counts writes since creation; `lease_id` 0 means no lease."""

    key: str
    value: bytes
    version: int
    create_revision: int
    mod_revision: int
    lease_id: int

    @property
    def text(self) -> str:
        return self.value.decode()


@dataclass(frozen=True)
class Snapshot:
    """The keys of a range at store revision `revision` (watch from `revision + 1` to miss nothing)."""

    items: list[KeyValue]
    revision: int


@dataclass(frozen=True)
class WatchEvent:
    """A change: PUT (new value) or DELETE (empty value); `revision` is the revision of the change."""

    kind: EventKind
    key: str
    value: bytes
    revision: int
    version: int
    create_revision: int
    lease_id: int
    prev_value: bytes | None = None
    """The value before the change, when the watch was created with `prev_kv=True`."""


@dataclass(frozen=True)
class TxnResult:
    """Outcome of a guarded write: `current` is the key as found when the guard failed."""

    succeeded: bool
    current: KeyValue | None
    revision: int


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _prefix_end(prefix: bytes) -> bytes:
    """End of the range of all keys starting with `prefix` (the prefix with its last byte + 1)."""
    head = prefix.rstrip(b"\xff")
    return head[:-1] + bytes([head[-1] + 1]) if head else b"\0"


def _key_value(raw: Any) -> KeyValue:
    return KeyValue(
        key=bytes(raw.key).decode(),
        value=bytes(raw.value),
        version=int(raw.version),
        create_revision=int(raw.create_revision),
        mod_revision=int(raw.mod_revision),
        lease_id=int(raw.lease),
    )


class _Client(aetcd.Client):  # type: ignore[misc]  # aetcd is untyped
    """aetcd's client over a TLS channel when given credentials (aetcd itself only opens plaintext ones);
    the same stubs, watcher and channel options as aetcd's own `connect`."""

    def __init__(self, *, credentials: grpc.ChannelCredentials | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._credentials is None:
            await super().connect()
            return
        if self._connected.is_set():
            return
        # Nothing here awaits (channels connect lazily), so no other task can race this one.
        target = f"{self._host}:{self._port}"
        self.channel = grpc.aio.secure_channel(target, self._credentials, options=list(self._options.items()))
        self.kvstub = aetcd.rpc.KVStub(self.channel)
        self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
        self.leasestub = aetcd.rpc.LeaseStub(self.channel)
        self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
        self.auth_stub = aetcd.rpc.AuthStub(self.channel)
        watch_stub = aetcd.rpc.WatchStub(self.channel)
        self._watcher = aetcd.watcher.Watcher(watch_stub, timeout=self._timeout, metadata=self.metadata)
        self._connected.set()


class EtcdClient:
    """An async etcd client over one endpoint or a cluster's comma-separated endpoints ("http://a:2379,
    http://b:2379,http://c:2379"); use as `async with EtcdClient(endpoint) as etcd`. `https://` endpoints
    talk TLS (`tls`, default: the system's roots and no client certificate)."""

    def __init__(self, endpoint: str, *, timeout: float = DEFAULT_TIMEOUT_S, tls: EtcdTls | None = None) -> None:
        addresses = endpoints_of(endpoint)
        secure = addresses[0].scheme == "https"
        if tls is not None and not secure:
            raise errors.InvalidArgumentError(f"etcd TLS settings need an https:// endpoint, got {endpoint!r}")
        host, port = channel_address(addresses)
        options = dict(_CHANNEL_OPTIONS)
        if secure and len(addresses) > 1:  # the target names no host: verify etcd's certificate against the first
            options["grpc.ssl_target_name_override"] = addresses[0].host
        self.endpoint = endpoint
        self.timeout = timeout
        self._secure = secure
        credentials = (tls or EtcdTls()).credentials() if secure else None
        self._client = _Client(host=host, port=port, timeout=timeout, options=options, credentials=credentials)
        self._leases: set[Lease] = set()

    async def __aenter__(self) -> Self:
        await self._call("connect", self._client.connect())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop every lease's keepalive (the leases then expire on their own) and close the channel."""
        for lease in list(self._leases):
            await lease.stop_keepalive("client closed")
        await self._client.close()

    def _error(self, error: BaseException, what: str, timeout: float | None = None) -> errors.LodestarError:
        if isinstance(error, errors.LodestarError):
            return error
        where = f"etcd {self.endpoint} ({what})"
        if isinstance(error, TimeoutError | aetcd.WatchTimeoutError | aetcd.ConnectionTimeoutError):
            return errors.UnavailableError(f"{where}: no answer within {timeout or self.timeout:g} s")
        if isinstance(error, aetcd.RevisionCompactedError):
            return WatchCompactedError(f"{where}: {error}", error.compacted_revision)
        cause = error.__cause__ if isinstance(error, aetcd.ClientError) else error
        if isinstance(cause, grpc.aio.AioRpcError):
            klass = _ERROR_BY_CODE.get(cause.code(), errors.UnavailableError)
            details = cause.details() or ""
            hint = ""
            if klass is errors.UnauthenticatedError:
                hint = " (is this client's certificate CN an etcd user with a role on the key?)"
            elif self._secure and any(sign in details for sign in _TLS_FAILURES):
                hint = " (TLS handshake failed: check the etcd CA and this client's certificate and key)"
            return klass(f"{where}: {cause.code().name}: {details[:200]}{hint}")
        return errors.UnavailableError(f"{where}: {type(error).__name__}: {str(error)[:200]}")

    async def _call(self, what: str, operation: Awaitable[T], timeout: float | None = None) -> T:
        """Await one client operation under the timeout, mapping its failures to lodestar errors."""
        limit = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                return await operation
        except (aetcd.ClientError, grpc.aio.AioRpcError, TimeoutError) as error:
            raise self._error(error, what, limit) from error

    async def ping(self) -> str:
        """The server's version; UnavailableError when etcd does not answer."""
        status = await self._call("status", self._client.status())
        return str(status.version)

    async def apply_auth(self, roles: list[EtcdRole]) -> None:
        """Set up `roles` (`lodestar.etcd_roles`) and turn auth on: a `root` user (no password: only a client
        certificate with CN `root` acts as it), each role with its grants, password-less users given them (with
        `--client-cert-auth` a client is its certificate's CN). What exists is kept: it can run again (as root
        once auth is on). Then a certificate whose CN is no user is refused (UnauthenticatedError)."""
        rpc = aetcd.rpc
        await self._call("connect", self._client.connect())
        stub = rpc.AuthStub(self._client.channel)

        def add_user(name: str) -> tuple[str, Callable[[], Awaitable[Any]]]:
            options = rpc.UserAddOptions(no_password=True)
            return f"add user {name}", partial(stub.UserAdd, rpc.AuthUserAddRequest(name=name, options=options))

        def give(user: str, role: str) -> tuple[str, Callable[[], Awaitable[Any]]]:
            request = rpc.AuthUserGrantRoleRequest(user=user, role=role)
            return f"grant {user} {role}", partial(stub.UserGrantRole, request)

        steps = [add_user("root"), give("root", "root")]
        for role in roles:
            steps.append((f"add role {role.name}", partial(stub.RoleAdd, rpc.AuthRoleAddRequest(name=role.name))))
            for grant in role.grants:
                key, kind = grant.key.encode(), rpc.Permission.READWRITE if grant.write else rpc.Permission.READ
                permission = rpc.Permission(permType=kind, key=key, range_end=_prefix_end(key) if grant.prefix else b"")
                request = rpc.AuthRoleGrantPermissionRequest(name=role.name, perm=permission)
                steps.append((f"grant {role.name} {grant.key}", partial(stub.RoleGrantPermission, request)))
            steps += [step for user in role.users for step in (add_user(user), give(user, role.name))]
        steps.append(("enable auth", lambda: stub.AuthEnable(rpc.AuthEnableRequest())))
        for what, step in steps:
            try:
                await self._call(what, step())
            except errors.FailedPreconditionError as error:
                if "already exists" not in error.message:
                    raise
        _log.info("etcd auth enabled", endpoint=self.endpoint, roles=[role.name for role in roles])

    # -- key/value ---------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        raw = await self._call(f"get {key}", self._client.get(key.encode()))
        return None if raw is None else _key_value(raw)

    async def _range(self, start: bytes, end: bytes, what: str) -> Snapshot:
        raw = await self._call(what, self._client.get_range(start, end, sort_order="ascend"))
        return Snapshot(items=[_key_value(kv) for kv in raw.kvs], revision=int(raw.header.revision))

    async def get_prefix(self, prefix: str) -> Snapshot:
        """Every key starting with `prefix`, sorted by key, with the revision they were read at."""
        start = prefix.encode()
        return await self._range(start, _prefix_end(start), f"get prefix {prefix}")

    async def get_key(self, key: str) -> Snapshot:
        """One key (zero or one item) with the store revision it was read at."""
        start = key.encode()
        return await self._range(start, start + b"\0", f"get {key}")

    async def put(self, key: str, value: bytes | str, *, lease: Lease | None = None) -> int:
        """Write `key`, bound to `lease` when given (deleted when the lease ends); returns the revision."""
        lease_id = 0 if lease is None else lease.id
        raw = await self._call(f"put {key}", self._client.put(key.encode(), _bytes(value), lease=lease_id))
        return int(raw.header.revision)

    async def put_many(self, items: list[tuple[str, bytes | str]], *, lease_id: int = 0) -> None:
        """Write every key in one transaction, bound to the lease with id `lease_id` (0: none), which may
        belong to another process (e.g. a node's lease). NotFoundError when that lease does not exist."""
        txn = self._client.transactions
        ops = [txn.put(key.encode(), _bytes(value), lease=lease_id) for key, value in items]
        await self._call(f"put {len(items)} keys", self._client.transaction([], ops, []))

    async def delete_many(self, keys: list[str]) -> None:
        """Delete every key (those that exist) in one transaction."""
        ops = [self._client.transactions.delete(key.encode()) for key in keys]
        await self._call(f"delete {len(keys)} keys", self._client.transaction([], ops, []))

    async def delete(self, key: str) -> bool:
        """Delete `key`; False when it did not exist."""
        raw = await self._call(f"delete {key}", self._client.delete(key.encode()))
        return raw is not None

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with `prefix`; returns how many were deleted."""
        raw = await self._call(f"delete prefix {prefix}", self._client.delete_prefix(prefix.encode()))
        return int(raw.deleted)

    # -- transactions ------------------------------------------------------------------------------

    async def _guarded(self, what: str, key: str, guards: list[Any], on_success: Any) -> TxnResult:
        """If every guard holds, run `on_success`; else read `key`. One atomic transaction."""
        txn = self._client.transactions
        succeeded, responses = await self._call(
            what, self._client.transaction(compare=guards, success=[on_success], failure=[txn.get(key.encode())])
        )
        if succeeded:
            response = responses[0]
            header = getattr(response, response.WhichOneof("response")).header
            return TxnResult(succeeded=True, current=None, revision=int(header.revision))
        found = responses[0] if responses else []
        if not found:
            return TxnResult(succeeded=False, current=None, revision=0)
        _, got = found[0]
        return TxnResult(succeeded=False, current=_key_value(got), revision=int(got.header.revision))

    def _expectations(
        self, key: bytes, expected_value: bytes | str | None, expected_mod_revision: int | None
    ) -> list[Any]:
        txn = self._client.transactions
        if (expected_value is None) == (expected_mod_revision is None):
            raise errors.InvalidArgumentError("give exactly one of expected_value, expected_mod_revision")
        if expected_value is not None:
            return [txn.value(key) == _bytes(expected_value)]
        return [txn.mod(key) == expected_mod_revision]

    async def create_if_absent(self, key: str, value: bytes | str, *, lease: Lease | None = None) -> TxnResult:
        """Create `key` only if it does not exist (version == 0); else report the existing key."""
        txn = self._client.transactions
        raw_key = key.encode()
        put = txn.put(raw_key, _bytes(value), lease=0 if lease is None else lease.id)
        return await self._guarded(f"create {key}", key, [txn.version(raw_key) == 0], put)

    async def compare_and_swap(
        self,
        key: str,
        value: bytes | str,
        *,
        expected_value: bytes | str | None = None,
        expected_mod_revision: int | None = None,
        lease: Lease | None = None,
    ) -> TxnResult:
        """Write `key` only if it currently has `expected_value` (or was last written at that revision)."""
        txn = self._client.transactions
        raw_key = key.encode()
        guards = self._expectations(raw_key, expected_value, expected_mod_revision)
        put = txn.put(raw_key, _bytes(value), lease=0 if lease is None else lease.id)
        return await self._guarded(f"compare-and-swap {key}", key, guards, put)

    async def compare_and_delete(
        self, key: str, *, expected_value: bytes | str | None = None, expected_mod_revision: int | None = None
    ) -> TxnResult:
        """Delete `key` only if it currently has `expected_value` (or was last written at that revision)."""
        raw_key = key.encode()
        guards = self._expectations(raw_key, expected_value, expected_mod_revision)
        delete = self._client.transactions.delete(raw_key)
        return await self._guarded(f"compare-and-delete {key}", key, guards, delete)

    # -- leases ------------------------------------------------------------------------------------

    async def grant_lease(self, ttl: int, *, keepalive: bool = True) -> Lease:
        """A new lease of `ttl` seconds (etcd may raise it to its minimum), kept alive unless told not to."""
        if ttl < 1:
            raise errors.InvalidArgumentError(f"lease ttl must be at least 1 s, got {ttl}")
        requested_at = time.monotonic()
        raw = await self._call("grant lease", self._client.lease(ttl))
        lease = Lease(self, int(raw.id), int(raw.ttl), expires_at=requested_at + int(raw.ttl))
        if keepalive:
            lease.start_keepalive()
        return lease

    async def _refresh(self, lease_id: int, timeout: float) -> int:
        """One keepalive round trip; returns the remaining TTL (0: the lease is gone)."""
        reply = await self._call(f"keepalive lease {lease_id:x}", self._client.refresh_lease(lease_id), timeout)
        return 0 if reply is None else int(reply.TTL)

    async def _revoke(self, lease_id: int) -> None:
        await self._call(f"revoke lease {lease_id:x}", self._client.revoke_lease(lease_id))

    # -- watches -----------------------------------------------------------------------------------

    async def _watch(
        self, start: bytes, end: bytes | None, start_revision: int | None, prev_kv: bool, deletes_only: bool = False
    ) -> Watch:
        kind = aetcd.EventKind.DELETE if deletes_only else None  # etcd filters PUTs out (NOPUT)
        raw = await self._call(
            f"watch {start.decode()}",
            self._client.watch(start, range_end=end, start_revision=start_revision, prev_kv=prev_kv, kind=kind),
        )
        return Watch(self, raw)

    async def watch(self, key: str, *, start_revision: int | None = None, prev_kv: bool = False) -> Watch:
        """Watch one key: changes from `start_revision` (inclusive), or from now when not given."""
        return await self._watch(key.encode(), None, start_revision, prev_kv)

    async def watch_prefix(
        self, prefix: str, *, start_revision: int | None = None, prev_kv: bool = False, deletes_only: bool = False
    ) -> Watch:
        """Watch every key starting with `prefix`; events arrive in revision order. `deletes_only`: etcd
        sends no PUT events (a watcher that acts on deletions alone need not receive and decode the rest)."""
        start = prefix.encode()
        return await self._watch(start, _prefix_end(start), start_revision, prev_kv, deletes_only)


class Watch:
    """An async iterator of `WatchEvent`s; `cancel()` (or leaving `async with`) ends it cleanly.

    Iteration raises UnavailableError if the watch stream breaks (etcd down): list again and re-watch.
    """

    def __init__(self, client: EtcdClient, raw: Any) -> None:
        self._client = client
        self._raw = raw
        self._events: AsyncIterator[Any] = raw.__aiter__()
        self._cancelled = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._cancelled:
            raise StopAsyncIteration
        try:
            raw = await anext(self._events)
        except (aetcd.ClientError, grpc.aio.AioRpcError) as error:
            raise self._client._error(error, "watch") from error
        kv = raw.kv
        return WatchEvent(
            kind=EventKind(str(raw.kind)),
            key=bytes(kv.key).decode(),
            value=bytes(kv.value),
            revision=int(kv.mod_revision),
            version=int(kv.version),
            create_revision=int(kv.create_revision),
            lease_id=int(kv.lease),
            prev_value=None if raw.prev_kv is None else bytes(raw.prev_kv.value),
        )

    async def cancel(self) -> None:
        """Stop the watch on the server; an iteration in progress ends with StopAsyncIteration."""
        if self._cancelled:
            return
        self._cancelled = True
        try:
            async with asyncio.timeout(self._client.timeout):
                await self._raw.cancel()
        except (aetcd.ClientError, grpc.aio.AioRpcError, TimeoutError) as error:
            _log.debug("watch cancel failed", error=str(error))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.cancel()


class Lease:
    """A granted lease. One background task refreshes it every TTL/3. When no refresh has been answered
    by the time etcd could expire it, or etcd reports it gone, the lease is *lost*: `is_lost` turns true
    and `wait_lost()` returns why. Keys put with a lost lease are gone (or about to be), so an owner
    must stop acting on them. `stop_keepalive()`, `revoke()` and closing the client also mark it lost.
    As an async context manager it is revoked on exit."""

    def __init__(self, client: EtcdClient, lease_id: int, ttl: int, *, expires_at: float) -> None:
        self._client = client
        self.id = lease_id
        self.ttl = ttl
        # When etcd may expire it at the earliest: a TTL after the last answered request was *sent*,
        # so this side never believes in a lease that etcd has already ended.
        self._expires_at = expires_at
        self._lost = asyncio.Event()
        self._reason = ""
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"Lease(id={self.id:x}, ttl={self.ttl}, lost={self.is_lost})"

    @property
    def is_lost(self) -> bool:
        return self._lost.is_set()

    @property
    def lost_reason(self) -> str:
        return self._reason

    async def wait_lost(self) -> str:
        """Block until the lease is lost; returns why."""
        await self._lost.wait()
        return self._reason

    def _mark_lost(self, reason: str, *, deliberate: bool = False) -> None:
        self._client._leases.discard(self)
        if not self._lost.is_set():
            self._reason = reason
            self._lost.set()
            log = _log.info if deliberate else _log.warning
            log("etcd lease lost", lease=f"{self.id:x}", reason=reason)

    def start_keepalive(self) -> None:
        if self._task is None and not self.is_lost:
            self._client._leases.add(self)
            self._task = asyncio.create_task(self._keepalive(), name=f"etcd-lease-{self.id:x}")

    async def stop_keepalive(self, reason: str = "keepalive stopped") -> None:
        """Stop refreshing: the lease expires after its TTL. Marks it lost (we no longer vouch for it)."""
        self._client._leases.discard(self)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._mark_lost(reason, deliberate=True)

    async def revoke(self) -> None:
        """End the lease now: its keys are deleted at once."""
        await self.stop_keepalive("revoked")
        await self._client._revoke(self.id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.revoke()
        except errors.LodestarError as failure:  # it expires on its own; do not mask the body's error
            _log.warning("etcd lease revoke failed", lease=f"{self.id:x}", error=failure.message)

    async def _keepalive(self) -> None:
        interval = max(self.ttl / 3, 0.1)
        delay, last_error = interval, ""
        while True:
            await asyncio.sleep(delay)
            sent_at = time.monotonic()
            if sent_at >= self._expires_at:
                self._mark_lost(f"no keepalive answer within its {self.ttl} s TTL: {last_error}")
                return
            timeout = min(self._client.timeout, interval, self._expires_at - sent_at)
            try:
                remaining = await self._client._refresh(self.id, timeout=timeout)
            except errors.LodestarError as error:
                last_error = error.message
                delay = min(0.5, max(self._expires_at - time.monotonic(), 0.0))
                continue
            except Exception as error:  # a bug must not leave an unrefreshed lease that looks alive
                self._mark_lost(f"keepalive crashed: {type(error).__name__}")
                raise
            if remaining <= 0:
                self._mark_lost("expired (etcd no longer knows it)")
                return
            self._expires_at, delay = sent_at + remaining, interval


__all__ = [
    "EtcdClient",
    "EtcdTls",
    "EventKind",
    "KeyValue",
    "Lease",
    "Snapshot",
    "TxnResult",
    "Watch",
    "WatchCompactedError",
    "WatchEvent",
    "tls_from_settings",
]
