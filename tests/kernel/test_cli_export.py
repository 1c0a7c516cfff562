"""`lodestar export RUN_ID` without `--store` finds the run in the local stores: `lodestar up`'s, then
`lodestar train`'s (the store `make run` writes), and says where it looked when neither holds it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from lodestar.errors import NotFoundError
from lodestar.v1 import rollout_pb2
from lodestar_app.cli.export import LOCAL_STORES, find_store
from lodestar_app.cli.main import main
from lodestar_rollout.store import SqliteStore

UP_STORE, TRAIN_STORE = LOCAL_STORES


def _store_with_run(path: Path, run_id: str | None) -> None:
    """A real (empty) SQLite rollout store at `path`, with a run row when `run_id` is given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    SqliteStore(path).close()
    if run_id is not None:
        with sqlite3.connect(path) as db:
            db.execute("INSERT INTO run_specs VALUES (?, ?)", (run_id, rollout_pb2.RunSpec().SerializeToString()))
            db.execute(
                "INSERT INTO runs (run_id, ordinal, created_at, state, groups_completed, groups_delivered, "
                "groups_dropped, infra_failures, stage_json) VALUES (?, 0, 0.0, 0, 0, 0, 0, 0, ?)",
                (run_id, '{"sums": {}, "counts": {}}'),
            )


def test_finds_the_train_store_when_up_has_no_such_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _store_with_run(UP_STORE, "run-other")
    _store_with_run(TRAIN_STORE, "run-trained")
    assert find_store("run-trained") == str(TRAIN_STORE)
    assert find_store("run-other") == str(UP_STORE)


def test_no_store_holding_the_run_names_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    TRAIN_STORE.parent.mkdir(parents=True)
    TRAIN_STORE.write_text("not a database")
    with pytest.raises(NotFoundError) as error:
        find_store("run-missing")
    assert str(UP_STORE) in error.value.message
    assert str(TRAIN_STORE) in error.value.message


def test_export_after_lodestar_train_needs_no_store_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _store_with_run(TRAIN_STORE, "run-trained")
    assert main(["export", "run-trained", "--min-reward", "0"]) == 0
    out = Path(capsys.readouterr().out.strip())
    assert out == Path("run-trained-sft.jsonl")
    assert out.is_file()
    assert main(["export", "run-missing"]) == 2
