"""Retention on a real rollout server (real etcd; real SQLite and PostgreSQL stores): DeleteRun and ArchiveRun
(and `lodestar run delete / archive`), which refuse a running run, leave no row of the run in the store; a
retention period deletes finished runs by itself; an older store without the newer run columns opens."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable
from pathlib import Path

import grpc
import grpc.aio
import pyarrow.parquet as pq
import pytest

from lodestar.etcd import EtcdClient
from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_rollout.stores import open_store
from tests.rollout.helpers import SimNode, call_record, make_spec, run_lodestar, settings, sim_node, start_rollout
from tests.waiting import eventually


def _rows_of(location: str, run_id: str) -> int:
    """Rows of the run (of up to 3 tasks x 2 samples) left in the store, in every table."""
    store = open_store(location)
    try:
        session_ids = [f"{run_id}-g{task}-s{sample}" for task in range(3) for sample in range(2)]
        rows = len(store.run_sessions(run_id)) + len(store.run_groups(run_id)) + (store.run_spec(run_id) is not None)
        rows += sum(len(store.attempts(sid)) + (store.shown_result(sid) is not None) for sid in session_ids)
        return rows + sum(run.run_id == run_id for run in store.load().runs)
    finally:
        store.close()


async def _complete_all(node: SimNode) -> None:
    while assigned := await node.acquire(8):
        for assignment in assigned:
            call = call_record(assignment.session_id, 0)
            call.continued_from_sequence = -1  # the first call of a conversation: one chain end, one record
            call.completion.role = common_pb2.ROLE_ASSISTANT
            call.completion.content.add().text.text = "done"
            await node.complete(assignment, reward=0.5, calls=[call])


async def _code(call: Awaitable[object]) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    return raised.value.code()


async def test_delete_and_archive_refuse_a_running_run_and_remove_every_row(
    store_location: str, etcd_endpoint: str, etcd_prefix: str, etcd: EtcdClient, tmp_path: Path
) -> None:
    config = settings(store_location, etcd_endpoint, etcd_prefix, archive_dir=tmp_path / "archive")
    async with start_rollout(config) as rollout, sim_node(etcd, rollout.stub, "n", ttl=30) as node:
        stub = rollout.stub
        running = await rollout.create_run(make_spec(tasks=3, group_size=2))
        await node.acquire(1)
        delete = rollout_pb2.DeleteRunRequest(run_id=running)
        assert await _code(stub.DeleteRun(delete)) == grpc.StatusCode.FAILED_PRECONDITION
        archive = rollout_pb2.ArchiveRunRequest(run_id=running)
        assert await _code(stub.ArchiveRun(archive)) == grpc.StatusCode.FAILED_PRECONDITION
        await stub.CancelRun(rollout_pb2.CancelRunRequest(run_id=running))
        assert (await stub.DeleteRun(delete)).run_id == running
        assert await _code(stub.GetRun(rollout_pb2.GetRunRequest(run_id=running))) == grpc.StatusCode.NOT_FOUND
        assert await _code(stub.DeleteRun(delete)) == grpc.StatusCode.NOT_FOUND

        done = await rollout.create_run(make_spec(tasks=3, group_size=2))
        await _complete_all(node)
        kept = await rollout.create_run(make_spec(tasks=3, group_size=2))
        assert (await rollout.get_run(done)).state == rollout_pb2.RUN_STATE_COMPLETED
        reply = await stub.ArchiveRun(rollout_pb2.ArchiveRunRequest(run_id=done))
        assert (reply.sessions, reply.records) == (6, 6)
        table = pq.read_table(reply.path).to_pylist()
        assert sorted(row["session_id"] for row in table) == sorted(
            f"{done}-g{task}-s{sample}" for task in range(3) for sample in range(2)
        )
        assert {row["reward"] for row in table} == {0.5}
        assert Path(reply.path).parent == (tmp_path / "archive").resolve()
        assert await _code(stub.GetRun(rollout_pb2.GetRunRequest(run_id=done))) == grpc.StatusCode.NOT_FOUND
        assert [run.run_id for run in (await stub.ListRuns(rollout_pb2.ListRunsRequest())).runs] == [kept]
        assert rollout.core.scheduler.runs.keys() == {kept}
    assert _rows_of(store_location, running) == 0
    assert _rows_of(store_location, done) == 0
    assert _rows_of(store_location, kept) == 11  # the count sees a run: its row, spec, 3 groups, 6 sessions


@pytest.mark.slow
async def test_the_cli_deletes_and_archives(
    tmp_path: Path, etcd_endpoint: str, etcd_prefix: str, etcd: EtcdClient
) -> None:
    config = settings(tmp_path / "rollout.sqlite", etcd_endpoint, etcd_prefix, archive_dir=tmp_path / "archive")
    async with start_rollout(config) as rollout, sim_node(etcd, rollout.stub, "n", ttl=30) as node:
        first = await rollout.create_run(make_spec(tasks=1, group_size=1))
        code, _, err = await run_lodestar("run", "delete", first, "--rollout", rollout.address)
        assert code == 2
        assert "cancel it before deleting it" in err
        await _complete_all(node)
        second = await rollout.create_run(make_spec(tasks=1, group_size=1))
        await _complete_all(node)
        code, out, _ = await run_lodestar("run", "delete", first, "--rollout", rollout.address)
        assert (code, out.strip()) == (0, f"run {first} deleted")
        code, out, _ = await run_lodestar("run", "archive", second, "--rollout", rollout.address)
        assert code == 0
        assert out.splitlines()[-1] == str(tmp_path / "archive" / f"{second}.parquet")
        assert len(pq.read_table(out.splitlines()[-1])) == 1
        assert rollout.core.scheduler.runs == {}


async def test_finished_runs_expire_after_the_retention_period(
    tmp_path: Path, etcd_endpoint: str, etcd_prefix: str, etcd: EtcdClient
) -> None:
    period_s = 1.5
    config = settings(tmp_path / "rollout.sqlite", etcd_endpoint, etcd_prefix, retention_days=period_s / 86400)
    async with start_rollout(config) as rollout, sim_node(etcd, rollout.stub, "n", ttl=30) as node:
        finished = await rollout.create_run(make_spec(tasks=1, group_size=1))
        await _complete_all(node)
        running = await rollout.create_run(make_spec(tasks=1, group_size=1))
        finished_at = rollout.core.scheduler.runs[finished].finished_at
        assert finished_at > 0
        await eventually(
            lambda: sorted(rollout.core.scheduler.runs),
            10,
            what="the finished run expired",
            until=lambda ids: finished not in ids,
        )
        assert time.time() - finished_at >= period_s
        assert rollout.core.scheduler.runs.keys() == {running}  # a running run never expires
    assert _rows_of(str(tmp_path / "rollout.sqlite"), finished) == 0


def test_a_store_from_before_the_new_run_columns_opens(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, ordinal INTEGER NOT NULL, created_at REAL NOT NULL, "
            "state INTEGER NOT NULL, groups_completed INTEGER NOT NULL, groups_delivered INTEGER NOT NULL, "
            "groups_dropped INTEGER NOT NULL, infra_failures INTEGER NOT NULL, stage_json TEXT NOT NULL)"
        )
        db.execute("CREATE TABLE run_specs (run_id TEXT PRIMARY KEY, spec BLOB NOT NULL)")
        db.execute("INSERT INTO runs VALUES ('r', 1, 5.0, 2, 0, 0, 0, 0, '{\"sums\": {}, \"counts\": {}}')")
        db.execute("INSERT INTO run_specs VALUES ('r', ?)", (make_spec(tasks=1).SerializeToString(),))
    store = open_store(str(path))
    try:
        (run,) = store.load().runs
        assert (run.run_id, run.state, run.finished_at, run.batch_estimate, run.version_mark) == (
            "r",
            2,
            0.0,
            0.0,
            (0, 0),
        )
    finally:
        store.close()
