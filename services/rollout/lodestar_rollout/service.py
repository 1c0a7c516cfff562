"""The rollout service while it leads: scheduler + durable store + etcd ownership, without gRPC.

Every operation mutates the in-memory `Scheduler` synchronously (no await in between, so operations
never interleave half-done), snapshots what changed and queues the write on the store's single thread
(FIFO: writes land in the order the state changed); replies wait for their write. Ownership keys are
written before a hand-out is answered and deleted (in the background, best effort) once an attempt
ended and its write landed; keys left behind while etcd was away are removed by the next
reconciliation. Reconciliation (on start and after every etcd reconnection) runs alone: no hand-out
claims keys while it compares the store's running attempts with etcd.

Memory holds the work in flight: once a write is queued, the groups it made done (delivered, dropped,
failed, cancelled) leave the scheduler with their sessions, and every read about them (views, the group
stream's resume, a late or repeated result) goes to the store. Finished runs can be deleted or archived
(exported to Parquet, then deleted), by hand or after `Retention.period_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from lodestar import errors
from lodestar.etcd import EtcdClient
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_rollout import browse, groups, retention, views
from lodestar_rollout.leases import Owners, Ownership, OwnershipWatch
from lodestar_rollout.model import Changes, Session
from lodestar_rollout.scheduler import Progress, Scheduler, ended_attempt_answer
from lodestar_rollout.spec import validate_spec, with_defaults
from lodestar_rollout.store import Store, rows_for
from lodestar_rollout.writer import KeyReleaser, StoreWriter

STREAM_RECHECK_S = 5.0
"""A waiting group stream re-checks its run at least this often (besides being woken)."""
ARCHIVE_TIMEOUT_S = 600.0
"""Longest wait for a run's archive (export + delete) before the RPC answers DEADLINE_EXCEEDED."""
_log = get_logger("rollout.service")


class ClaimGate:
    """Many hand-outs may claim ownership keys at once, or one reconciliation alone."""

    def __init__(self) -> None:
        self._active = 0
        self._closed = False
        self._condition = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._condition:
            await self._condition.wait_for(lambda: not self._closed)
            self._active += 1
        try:
            yield
        finally:
            async with self._condition:
                self._active -= 1
                self._condition.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._condition:
            await self._condition.wait_for(lambda: not self._closed)
            self._closed = True
            await self._condition.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            async with self._condition:
                self._closed = False
                self._condition.notify_all()


class RolloutCore:
    """Runs, hand-outs, results and group streams of one leading rollout service."""

    def __init__(
        self,
        store: Store,
        etcd: EtcdClient,
        prefix: str,
        *,
        clock: Callable[[], float] = time.time,
        keep: retention.Retention | None = None,
    ) -> None:
        self.scheduler = Scheduler()
        self.retention = keep or retention.Retention()
        self.store = store
        self.ownership = Ownership(etcd, prefix)
        self.watch = OwnershipWatch(self.ownership, self._reconcile, self._on_deleted)
        self._clock = clock
        self.writer = StoreWriter(store)
        self._releaser = KeyReleaser(self.ownership)
        self._gate = ClaimGate()
        self._run_events: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.stopped = False

    async def start(self) -> None:
        """Load the store and start following etcd (its first pass reconciles running attempts)."""
        state = await self.writer.read(self.store.load)
        self.scheduler.restore(state.runs, state.groups, state.sessions)
        self.scheduler.policy_version = state.policy_version
        running = len(self.scheduler.running())
        _log.info("rollout state loaded", runs=len(state.runs), sessions=len(state.sessions), running=running)
        unstamped = {run.run_id for run in state.runs if run.finished and not run.finished_at}
        for run_id in unstamped:  # finished before finish times were kept: retention counts from now
            self.scheduler.runs[run_id].finished_at = self._clock()
        await self._persist(Changes(runs=unstamped))
        self._spawn(self.watch.run(), "ownership-watch")
        if self.retention.period_s > 0:
            self._spawn(self._expire_loop(), "retention")

    async def stop(self) -> None:
        self.stopped = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for event in self._run_events.values():
            event.set()
        await self._releaser.close()
        await self.writer.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _spawn(self, coroutine: Any, name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _persist(self, changes: Changes) -> asyncio.Future[None]:
        """Queue the write of `changes` (in order), wake group streams, and release the keys of ended
        attempts once the write landed."""
        scheduler = self.scheduler
        for run_id in changes.runs:
            run = scheduler.runs[run_id]
            if run.finished and not run.finished_at:
                run.finished_at = self._clock()
        written = self.writer.write(rows_for(changes, scheduler.runs, scheduler.groups, scheduler.sessions))
        scheduler.forget_done(changes.groups)  # snapshotted: the store answers for done groups from now on
        for run_id in changes.group_events:
            self._run_events.pop(run_id, asyncio.Event()).set()
        if changes.released:
            self._releaser.release(list(changes.released), written)
        return written

    async def _reconcile(self) -> int:
        async with self._gate.exclusive():
            owners: Owners
            owners, revision = await self.ownership.snapshot()
            changes, stale = self.scheduler.reconcile(owners, self._clock())
            lost = len(changes.attempts)
            await self._persist(changes)
        if stale:
            self._releaser.release(stale)
        _log.info("reconciled with etcd", keys=len(owners), lost=lost, stale=len(stale), revision=revision)
        return revision

    async def _on_deleted(self, session_id: str, attempt: int) -> None:
        changes = self.scheduler.lose(session_id, attempt, "ownership key deleted (node lease ended)", self._clock())
        if changes:
            _log.info("attempt lost with its node's lease", session=session_id, attempt=attempt)
            await self._persist(changes)

    # -- runs --------------------------------------------------------------------------------------

    async def create_run(self, spec: rollout_pb2.RunSpec) -> rollout_pb2.Run:
        validate_spec(spec)
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        changes = self.scheduler.add_run(run_id, with_defaults(spec), self._clock())
        await self._persist(changes)
        _log.info("run created", run=run_id, tasks=len(spec.tasks), group_size=spec.group_size)
        return self.run_view(run_id)

    def run_view(self, run_id: str) -> rollout_pb2.Run:
        scheduler = self.scheduler
        run = scheduler.run(run_id)
        sessions = (scheduler.sessions[sid] for gid in run.group_ids for sid in scheduler.groups[gid].session_ids)
        return views.run_view(run, sessions, scheduler.policy_version)

    async def cancel_run(self, run_id: str) -> rollout_pb2.Run:
        await self._persist(self.scheduler.cancel_run(run_id))
        return self.run_view(run_id)

    async def delete_run(self, run_id: str) -> None:
        """Delete a finished run from memory and the store (FailedPreconditionError while it runs)."""
        self.scheduler.delete_run(run_id)
        self._run_events.pop(run_id, asyncio.Event()).set()  # its waiting streams end
        await self.writer.read(self.store.delete_run, run_id)
        _log.info("run deleted", run=run_id)

    async def archive_run(self, run_id: str) -> retention.Archived:
        """Export a finished run's scored trajectories to Parquet under the archive folder, then delete it."""
        if not self.scheduler.run(run_id).finished:
            raise errors.FailedPreconditionError(f"run {run_id} is running: cancel it before archiving it")
        try:
            async with asyncio.timeout(ARCHIVE_TIMEOUT_S):
                archived = await self.writer.read(retention.archive, self.store, run_id, self.retention.archive_dir)
        except TimeoutError:
            raise errors.DeadlineExceededError(f"archiving run {run_id} took over {ARCHIVE_TIMEOUT_S:.0f} s") from None
        await self.delete_run(run_id)
        _log.info("run archived", run=run_id, path=str(archived.path), records=archived.records)
        return archived

    async def _expire_loop(self) -> None:
        """Delete finished runs once the retention period passed since they finished."""
        while True:
            for run_id in retention.expired(self.scheduler.runs.values(), self.retention.period_s, self._clock()):
                try:
                    await self.delete_run(run_id)
                except errors.NotFoundError:  # deleted by hand meanwhile
                    continue
                except Exception as error:  # the store failed: try again next time
                    _log.error("could not delete an expired run", run=run_id, exc_info=error)
                    continue
                _log.info("run expired", run=run_id, retention_s=self.retention.period_s)
            await asyncio.sleep(self.retention.check_interval_s)

    # -- read-only views (dashboards) ------------------------------------------------------------

    def list_runs(self, limit: int) -> list[rollout_pb2.Run]:
        """Every run, newest first (at most `limit`; 0: all)."""
        runs = sorted(self.scheduler.runs.values(), key=lambda run: run.ordinal, reverse=True)
        return [self.run_view(run.run_id) for run in runs[: limit or None]]

    async def list_groups(self, run_id: str) -> list[rollout_pb2.GroupSummary]:
        """The run's groups (task order): live ones from memory, the others from the store."""
        scheduler = self.scheduler
        run = scheduler.run(run_id)
        out = []
        for group, stored in await self.writer.read(self.store.run_groups, run_id):
            live = scheduler.groups.get(group.group_id)
            if live is not None:
                group, stored = live, [scheduler.sessions[sid] for sid in live.session_ids]
            out.append(browse.group_summary(group, run, sorted(stored, key=lambda s: s.sample)))
        return out

    async def _session(self, session_id: str) -> Session:
        """The session from memory while its group is live, else from the store (NotFoundError: none)."""
        session = self.scheduler.sessions.get(session_id)
        if session is None:
            session = await self.writer.read(self.store.session, session_id)
        if session is None:
            raise errors.NotFoundError(f"no session {session_id!r}")
        return session

    async def session_detail(
        self, request: rollout_pb2.GetSessionDetailRequest
    ) -> rollout_pb2.GetSessionDetailResponse:
        session = await self._session(request.session_id)
        summary = browse.session_summary(session, self.scheduler.run(session.run_id))
        attempts = await self.writer.read(self.store.attempts, session.session_id)
        shown = await self.writer.read(self.store.shown_result, session.session_id)
        return browse.session_detail(summary, attempts, shown, request)

    async def failed_attempts(self, run_id: str, limit: int) -> list[rollout_pb2.FailedAttempt]:
        self.scheduler.run(run_id)  # NOT_FOUND for an unknown run
        records = await self.writer.read(self.store.failed_attempts, run_id, limit)
        return [browse.failed_attempt(record) for record in records]

    async def report_policy_version(self, version: int) -> int:
        await self._persist(self.scheduler.report_policy_version(version))
        _log.info("policy version reported", policy_version=version)  # when rollout heard it (docs/chaos.md)
        return version

    # -- nodes -------------------------------------------------------------------------------------

    async def acquire(
        self, node_id: str, lease_id: int, free_slots: int, in_flight: Iterable[Progress]
    ) -> tuple[list[rollout_pb2.SessionAssignment], list[tuple[str, int]]]:
        """Hand out up to `free_slots` sessions and say which held attempts the node must stop."""
        async with self._gate.shared():
            acquisition = self.scheduler.acquire(node_id, lease_id, free_slots, in_flight, self._clock())
            written = self._persist(acquisition.changes)
            assigned = acquisition.assigned
            if assigned:
                try:
                    await self.ownership.claim([(s.session_id, node_id, s.attempt) for s in assigned], lease_id)
                except BaseException:  # etcd refused, or the caller went away: nothing was handed out
                    self.scheduler.revert(assigned)
                    self._persist(Changes(sessions={s.session_id for s in assigned}))
                    await written
                    raise
            await written
        return [self._assignment(session) for session in assigned], acquisition.cancelled

    def _assignment(self, session: Session) -> rollout_pb2.SessionAssignment:
        return views.assignment(session, self.scheduler.runs[session.run_id])

    async def complete(self, result: rollout_pb2.SessionResult) -> bool:
        """Record a node's result (fenced); returns whether it counted toward its group."""
        if result.session_id in self.scheduler.sessions:
            counted, changes = self.scheduler.complete(result, self._clock())
        else:  # its group is done and left memory: a repeated or late report
            answered = ended_attempt_answer(await self._session(result.session_id), result)
            if answered is None:
                raise errors.FailedPreconditionError(f"session {result.session_id} is not running")
            counted, changes = answered
        if changes:
            await self._persist(changes)
        return counted

    # -- groups ------------------------------------------------------------------------------------

    async def stream_groups(
        self, run_id: str, start_after: int, *, tokens_only: bool = False, max_groups: int = 0
    ) -> AsyncIterator[rollout_pb2.StreamGroupsResponse]:
        """Complete groups after delivery sequence `start_after` (each as the stream's message), waiting for new
        ones until the run ends or `max_groups` were sent (0: no limit)."""
        run = self.scheduler.run(run_id)
        sent = start_after
        while not max_groups or sent - start_after < max_groups:
            if self.stopped:
                raise errors.UnavailableError("this rollout instance stopped leading: reconnect to the leader")
            event = self._run_events.setdefault(run_id, asyncio.Event())
            if sent < run.groups_delivered:  # delivered before: it left memory
                group = await self.writer.read(self.store.delivered_group, run_id, sent + 1)
                if group is None:
                    raise errors.NotFoundError(f"run {run_id} was deleted")
                session_ids = group.session_ids
            else:
                group, changes = groups.next_group(self.scheduler, run, sent)
                session_ids = groups.scored_session_ids(self.scheduler, group) if group is not None else []
                if changes:
                    await self._persist(changes)
            if group is not None:
                results = await self.writer.read(self.store.counted_results, session_ids)
                if tokens_only:
                    for result in results:
                        views.strip_bodies(result)
                yield views.group_response(group, run, results)
                sent = group.delivery_seq
                continue
            if run.finished:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STREAM_RECHECK_S):
                    await event.wait()
