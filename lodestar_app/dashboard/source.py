"""Where the dashboard reads from: the rollout service over gRPC (`RolloutReader`) and the trainer's run
directories (`metrics.jsonl`). Every call has a deadline; a failed call raises its domain error (an unknown
run or session: `NotFoundError`; rollout down: `UnavailableError`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
import grpc.aio

from lodestar.errors import NotFoundError
from lodestar.grpc.client import LeaderChannel
from lodestar.grpc.errors import error_from_rpc
from lodestar.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc

RPC_TIMEOUT_S = 15.0
"""Deadline of each rollout call (a session's result page is read from the store: keep it generous)."""
METRICS_FILE = "metrics.jsonl"
MAX_METRICS_BYTES = 64 << 20
"""A metrics file larger than this is read from its last 64 MiB only (a very long run)."""
T = TypeVar("T")


class RolloutReader:
    """The read-only RolloutService calls of the dashboard on one channel that follows the leader."""

    def __init__(self, target: str, *, timeout: float = RPC_TIMEOUT_S) -> None:
        self.target = target
        self._timeout = timeout
        self._channel = LeaderChannel(target, default_timeout=timeout)

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, rpc: Callable[[rollout_pb2_grpc.RolloutServiceAsyncStub], Awaitable[T]]) -> T:
        try:
            return await self._channel.call(lambda channel: rpc(rollout_pb2_grpc.RolloutServiceStub(channel)))
        except grpc.aio.AioRpcError as error:
            raise error_from_rpc(error) from None

    async def list_runs(self, limit: int = 0) -> list[rollout_pb2.Run]:
        request = rollout_pb2.ListRunsRequest(limit=limit)
        return list((await self._call(lambda s: s.ListRuns(request, timeout=self._timeout))).runs)

    async def get_run(self, run_id: str) -> rollout_pb2.Run:
        request = rollout_pb2.GetRunRequest(run_id=run_id)
        return (await self._call(lambda s: s.GetRun(request, timeout=self._timeout))).run

    async def list_groups(self, run_id: str) -> list[rollout_pb2.GroupSummary]:
        request = rollout_pb2.ListGroupsRequest(run_id=run_id)
        return list((await self._call(lambda s: s.ListGroups(request, timeout=self._timeout))).groups)

    async def failed_attempts(self, run_id: str, limit: int) -> list[rollout_pb2.FailedAttempt]:
        request = rollout_pb2.ListFailedAttemptsRequest(run_id=run_id, limit=limit)
        return list((await self._call(lambda s: s.ListFailedAttempts(request, timeout=self._timeout))).attempts)

    async def session(
        self, session_id: str, offset: int, limit: int, *, bodies: bool
    ) -> rollout_pb2.GetSessionDetailResponse:
        request = rollout_pb2.GetSessionDetailRequest(
            session_id=session_id, call_offset=offset, call_limit=limit, calls_without_bodies=not bodies
        )
        return await self._call(lambda s: s.GetSessionDetail(request, timeout=self._timeout))

    async def call(
        self, session_id: str, sequence: int
    ) -> tuple[rollout_pb2.GetSessionDetailResponse, common_pb2.CallRecord]:
        """The session and its call with `sequence` (with its body); NotFoundError when there is none.

        Calls are stored in sequence order and sequences are contiguous from 0, so the call is at index
        `sequence`; the record's own sequence number is checked all the same."""
        detail = await self.session(session_id, sequence, 1, bodies=True)
        calls = detail.result.calls
        if not calls or calls[0].sequence != sequence:
            raise NotFoundError(f"session {session_id} has no call #{sequence}")
        return detail, calls[0]


def parse_metrics(text: str) -> list[dict[str, float]]:
    """The step records of a metrics.jsonl text, in file order. A line that is not a JSON object (a step being
    written, a truncated first line) is skipped; non-numeric values are left out."""
    records = []
    for line in text.splitlines():
        try:
            document = json.loads(line)
        except ValueError:
            continue
        if not isinstance(document, dict) or "step" not in document:
            continue
        records.append(
            {
                key: float(value)
                for key, value in document.items()
                if isinstance(value, int | float) and not isinstance(value, bool)
            }
        )
    return records


def read_metrics(runs_dir: Path | None, run_id: str) -> list[dict[str, float]]:
    """The step records of `<runs_dir>/<run_id>/metrics.jsonl` ([] when there is none yet)."""
    if runs_dir is None or not run_id or "/" in run_id or run_id in (".", ".."):
        return []
    path = runs_dir / run_id / METRICS_FILE
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(size - MAX_METRICS_BYTES, 0))
            data = handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return []
    return parse_metrics(data.decode("utf-8", errors="replace"))
