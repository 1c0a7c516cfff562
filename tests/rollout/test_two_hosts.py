"""The rollout control plane across two hosts: a leader on host A and a standby on host B (two network
namespaces on a bridge, `tests/netns_support.py`), one PostgreSQL and a 3-member etcd on the infra host
(the bridge's address), every process real and every connection over the bridge. etcd speaks TLS and requires
client certificates, all from one CA (`lodestar.tls`, as `lodestar up --tls` makes; the members' own
certificates name the bridge's address); the rollout instances require the control-plane token.

Three simulated gateway nodes (real etcd leases; the node's own `GrpcRollout` client given both rollout
addresses, and its `complete_with_retries`) acquire and report sessions while a reader follows the group
stream, resuming after the groups it has. Once a third of the sessions counted and a group was read, the
leader's process is SIGKILLed. The standby takes over within about a lease TTL and the run completes:
every session is counted exactly once (in the nodes' answers and in PostgreSQL), none is lost, a result
whose reply was lost is answered again without being counted twice, and the reader sees each group once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from lodestar.errors import LodestarError
from lodestar.etcd import EtcdClient, EtcdTls
from lodestar.grpc import security
from lodestar.grpc.client import LeaderChannel, connect, leader_from_error
from lodestar.grpc.security import Security
from lodestar.tls import LocalPki, ensure_local_pki
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_app.local import wait_serving
from lodestar_gateway.node.rollout_client import GrpcRollout, RetryPolicy, complete_with_retries
from lodestar_trainer.rollout_client import RolloutClient
from tests.etcd_support import EtcdCluster, MemberTls, certificate_for_address
from tests.netns_support import HostNetwork, unavailable_reason
from tests.rollout.helpers import call_record, make_spec
from tests.rollout.postgres import PACKAGE_HINT, PostgresServer, find_bin_dir
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
TOKEN = "two-hosts-test-token"
ROLLOUT_PORT = 50053
LEADER_TTL_S = 2
NODE_TTL_S = 10
TASKS, GROUP_SIZE = 16, 4
SESSIONS = TASKS * GROUP_SIZE
NODES, SLOTS = 3, 4
RETRIES = RetryPolicy(attempts=40, initial_s=0.2, max_s=1.0, rpc_timeout_s=20.0)


@pytest.fixture
def hosts() -> Iterator[HostNetwork]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    network = HostNetwork(("a", "b"))
    try:
        yield network
    finally:
        network.close()


@pytest.fixture
def postgres(hosts: HostNetwork) -> Iterator[PostgresServer]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.fail(f"PostgreSQL not found: {PACKAGE_HINT}", pytrace=False)
    server = PostgresServer(bin_dir, host=hosts.infra_ip, trusted=str(hosts.subnet))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pki(tmp_path: Path) -> LocalPki:
    return ensure_local_pki(tmp_path / "pki", ("rollout", "client"))


@pytest.fixture
def cluster(hosts: HostNetwork, pki: LocalPki, tmp_path: Path) -> Iterator[EtcdCluster]:
    server = certificate_for_address(pki, tmp_path / "pki", hosts.infra_ip)
    tls = MemberTls(pki.ca, server, pki.identities["client"])
    started = EtcdCluster(tmp_path / "etcd", host=hosts.infra_ip, tls=tls)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def client_token() -> Iterator[None]:
    """This process's gRPC clients send the deployment's token (the rollout instances require it)."""
    before = security.current()
    security.configure(Security(token=TOKEN))
    try:
        yield
    finally:
        security.configure(before)


@contextlib.contextmanager
def rollout_on(
    hosts: HostNetwork, host: str, etcd: str, prefix: str, store: str, pki: LocalPki, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`lodestar rollout serve` inside `host`'s namespace, bound to its address (SIGTERM, then SIGKILL, at exit)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    argv = [sys.executable, "-m", "lodestar_app.cli.main", "rollout", "serve", "--host", hosts.ips[host]]
    argv += ["--port", str(ROLLOUT_PORT), "--auth-token-file", str(token_file), "--etcd", etcd]
    own = pki.identities["rollout"]
    argv += ["--etcd-tls-ca", str(pki.ca), "--etcd-tls-cert", str(own.cert), "--etcd-tls-key", str(own.key)]
    argv += ["--etcd-prefix", prefix, "--store", store]
    argv += ["--leader-ttl-s", str(LEADER_TTL_S), "--log-json"]
    with (tmp_path / f"rollout-{host}.log").open("ab") as log:
        process = subprocess.Popen(hosts.exec_argv(host, argv), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Ledger:
    """What the nodes and the reader saw."""

    answers: list[tuple[str, int, str, str]] = field(default_factory=list)
    """(session, attempt, node, what `complete_with_retries` returned) for every result a node reported."""
    handed_out: Counter[tuple[str, int]] = field(default_factory=Counter)
    cancelled: list[tuple[str, int]] = field(default_factory=list)
    """Attempts a node was told to stop while it still ran them."""
    groups: list[rollout_pb2.Group] = field(default_factory=list)
    killed: bool = False
    counted_after_kill: int = 0

    def counted(self) -> list[tuple[str, int, str]]:
        return [(sid, attempt, node) for sid, attempt, node, what in self.answers if what == "counted"]


async def simulated_node(
    node_id: str, etcd: EtcdClient, targets: str, ledger: Ledger, finished: asyncio.Event, seed: int
) -> None:
    """A gateway node's loop without the harness: acquire while it has free slots (reporting what it holds),
    "run" each session for a few hundred ms, report the result with the node's retries."""
    rng = random.Random(seed)
    link = GrpcRollout(targets)
    lease = await etcd.grant_lease(NODE_TTL_S)
    held: dict[str, tuple[rollout_pb2.SessionAssignment, asyncio.Task[None]]] = {}
    # Sessions whose result is being reported: decided, so no longer cancelled (as lodestar_gateway/node/attempt.py);
    # acquire names such an attempt as cancelled when its result lands during the call.
    reporting: set[str] = set()

    async def run(assignment: rollout_pb2.SessionAssignment) -> None:
        await asyncio.sleep(rng.uniform(0.2, 0.8))
        reporting.add(assignment.session_id)
        result = rollout_pb2.SessionResult(
            session_id=assignment.session_id,
            attempt=assignment.attempt,
            node_id=node_id,
            outcome=rollout_pb2.SESSION_OUTCOME_SCORED,
            reward=rng.random(),
            calls=[call_record(assignment.session_id)],
        )
        what = await complete_with_retries(link, result, RETRIES)
        ledger.answers.append((assignment.session_id, assignment.attempt, node_id, what))
        if what == "counted" and ledger.killed:
            ledger.counted_after_kill += 1
        held.pop(assignment.session_id, None)
        reporting.discard(assignment.session_id)

    try:
        while not finished.is_set():
            free = SLOTS - len(held)
            if free > 0:
                progress = [
                    rollout_pb2.SessionProgress(session_id=sid, attempt=a.attempt, stage=rollout_pb2.SESSION_STAGE_RUN)
                    for sid, (a, _) in held.items()
                ]
                try:
                    acquired = await link.acquire(node_id, lease.id, free, progress)
                except LodestarError:  # the leader is gone or not elected yet: as a node, try again
                    await asyncio.sleep(0.2)
                    continue
                for ref in acquired.cancelled:  # also names attempts whose result landed during the call
                    entry = held.get(ref.session_id)
                    if entry is not None and entry[0].attempt == ref.attempt and ref.session_id not in reporting:
                        ledger.cancelled.append((ref.session_id, ref.attempt))
                        entry[1].cancel()
                        del held[ref.session_id]
                for assignment in acquired.sessions:
                    ledger.handed_out[(assignment.session_id, assignment.attempt)] += 1
                    held[assignment.session_id] = (assignment, asyncio.create_task(run(assignment)))
            await asyncio.sleep(0.1)
        await asyncio.gather(*(task for _, task in held.values()), return_exceptions=True)
    finally:
        for _, task in held.values():
            task.cancel()
        await link.close()
        with contextlib.suppress(LodestarError):
            await lease.revoke()


async def read_groups(targets: list[str], run_id: str, ledger: Ledger) -> None:
    """The trainer's own group reader (`lodestar_trainer.rollout_client`, in a thread as the trainer runs it),
    given both hosts' addresses: when the stream breaks it goes where a follower points, else to the next
    address, and resumes after the groups it has."""
    client = RolloutClient(",".join(targets), run_id)

    def read() -> None:
        for group in client.groups(0):
            ledger.groups.append(group)

    try:
        await asyncio.to_thread(read)
    finally:
        client.cancel()
        client.close()


def report_version(targets: list[str], run_id: str, version: int) -> None:
    """The trainer's policy-version report, sent while the leader is dead and the standby not yet leading."""
    client = RolloutClient(",".join(targets), run_id, rpc_timeout_s=5.0, reconnect_s=LEADER_TTL_S + 30)
    try:
        client.report_policy_version(version)
    finally:
        client.close()


async def _names_leader(address: str) -> str | None:
    """The leader a standby names (None while it names none, or leads itself)."""
    async with connect(address) as channel:
        try:
            await rollout_pb2_grpc.RolloutServiceStub(channel).GetRun(rollout_pb2.GetRunRequest(run_id="x"))
        except grpc.aio.AioRpcError as error:
            return leader_from_error(error)
    return None


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


@contextlib.asynccontextmanager
async def _tasks(*coroutines: Coroutine[Any, Any, None]) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.create_task(c) for c in coroutines]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.slow
async def test_killing_the_leader_host_mid_run_loses_nothing_and_counts_nothing_twice(
    hosts: HostNetwork,
    postgres: PostgresServer,
    cluster: EtcdCluster,
    pki: LocalPki,
    client_token: None,
    tmp_path: Path,
    etcd_prefix: str,
) -> None:
    store = postgres.create_database()
    endpoints = ",".join(cluster.clients.values())
    a, b = (f"{hosts.ips[host]}:{ROLLOUT_PORT}" for host in ("a", "b"))
    logs = {host: tmp_path / f"rollout-{host}.log" for host in ("a", "b")}
    with rollout_on(hosts, "a", endpoints, etcd_prefix, store, pki, tmp_path) as leader:
        await wait_serving(a, 60)
        with rollout_on(hosts, "b", endpoints, etcd_prefix, store, pki, tmp_path) as standby:
            await eventually(lambda: _names_leader(b), 60, what="the standby on host B to name the leader")
            assert await _names_leader(b) == a

            run_id = await _create_run(b)  # through the standby's redirect

            ledger, finished, client = Ledger(), asyncio.Event(), pki.identities["client"]
            async with (
                EtcdClient(endpoints, tls=EtcdTls(pki.ca, client.cert, client.key)) as etcd,
                _tasks(
                    read_groups([a, b], run_id, ledger),
                    *(simulated_node(f"node-{i}", etcd, f"{a},{b}", ledger, finished, i) for i in range(NODES)),
                ) as (reader, *nodes),
            ):
                await eventually(
                    lambda: len(ledger.counted()) >= SESSIONS // 3 and len(ledger.groups) >= 1,
                    60,
                    what="a third of the sessions counted and a group read",
                )
                os.kill(leader.pid, signal.SIGKILL)
                ledger.killed = True
                counted_at_kill, groups_at_kill = len(ledger.counted()), len(ledger.groups)
                killed_at = time.monotonic()
                assert leader.wait(10) == -signal.SIGKILL
                report = asyncio.create_task(asyncio.to_thread(report_version, [a, b], run_id, 1))
                await wait_serving(b, LEADER_TTL_S + 15)
                took_over_s = time.monotonic() - killed_at
                async with asyncio.timeout(LEADER_TTL_S + 45):
                    await report  # the trainer's report reached the new leader

                async with asyncio.timeout(60):
                    await reader  # ends when the run finished
                finished.set()
                async with asyncio.timeout(30):
                    await asyncio.gather(*nodes)

                reply, run = await _report_again(b, ledger, run_id)
            assert standby.poll() is None, _tail(logs["b"])

    # The kill came mid-run: sessions counted and groups read on both sides of it.
    assert 0 < counted_at_kill < SESSIONS
    assert 0 < groups_at_kill < TASKS
    assert ledger.counted_after_kill > 0
    assert took_over_s < LEADER_TTL_S + 10, _tail(logs["b"])

    # None lost: the run completed on the standby with every session scored.
    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, _tail(logs["b"])
    assert run.policy_version == 1  # the report sent across the failover
    assert (run.sessions_succeeded, run.groups_complete) == (SESSIONS, TASKS)
    assert reply.counted  # the repeated report gets the first answer...
    _assert_counted_once(ledger, store)  # ... and nothing counted twice


async def _create_run(address: str) -> str:
    """A run of TASKS tasks by GROUP_SIZE, created through `address` (a standby redirects to its leader)."""
    creator = LeaderChannel(address)
    try:
        spec = make_spec(tasks=TASKS, group_size=GROUP_SIZE)
        created = await creator.call(
            lambda ch: rollout_pb2_grpc.RolloutServiceStub(ch).CreateRun(rollout_pb2.CreateRunRequest(spec=spec))
        )
    finally:
        await creator.close()
    return str(created.run.run_id)


async def _report_again(address: str, ledger: Ledger, run_id: str) -> tuple[Any, Any]:
    """A result counted by the dead leader whose reply was lost: the node reports it again to the new leader
    (at `address`), which must answer as the first time and count nothing more. The reply, and the run after."""
    session_id, attempt, node_id = ledger.counted()[0]
    again = rollout_pb2.SessionResult(
        session_id=session_id, attempt=attempt, node_id=node_id, outcome=rollout_pb2.SESSION_OUTCOME_SCORED
    )
    async with connect(address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        reply = await stub.CompleteSession(rollout_pb2.CompleteSessionRequest(result=again))
        run = (await stub.GetRun(rollout_pb2.GetRunRequest(run_id=run_id))).run
    return reply, run


def _assert_counted_once(ledger: Ledger, store: str) -> None:
    """Nothing counted twice: one counted answer per session, one counted row per session, each group read once
    with the counted attempt of its sessions."""
    counted = ledger.counted()
    assert len(counted) == len({sid for sid, _, _ in counted}) == SESSIONS
    assert Counter(what for *_, what in ledger.answers) == {"counted": SESSIONS}  # nothing fenced or refused
    assert all(times == 1 for times in ledger.handed_out.values())  # no attempt handed out twice
    for sid, attempt, _ in counted:  # requeued only if no node ever got the earlier attempt (a lost reply)
        assert all((sid, earlier) not in ledger.handed_out for earlier in range(1, attempt))
    assert not ledger.cancelled
    with psycopg.connect(store, autocommit=True) as db:
        rows = db.execute("SELECT session_id, attempt FROM results WHERE counted = 1").fetchall()
        scored = db.execute("SELECT COUNT(*) FROM sessions WHERE status = 'scored' AND counted = 1").fetchone()
    assert sorted(rows) == sorted((sid, attempt) for sid, attempt, _ in counted)
    assert scored == (SESSIONS,)

    # The reader saw each group once, each with the counted attempt of its sessions.
    assert len(ledger.groups) == len({g.group_id for g in ledger.groups}) == TASKS
    delivered = [(s.session_id, s.attempt) for g in ledger.groups for s in g.sessions]
    assert sorted(delivered) == sorted(rows)
