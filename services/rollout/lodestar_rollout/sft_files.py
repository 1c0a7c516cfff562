"""SFT record files: chat JSONL (one JSON object per line) and Parquet (pyarrow, imported only here).

The Parquet schema is explicit, so every file of every run has the same columns whatever the harness:
`messages` is a list of structs (role, content, name, reasoning_content, tool_call_id, tool_calls: list of
{id, type, function: {name, arguments}}); `tools` is a list of {type, function: {name, description,
parameters}} where `parameters` is the JSON schema as JSON text (schemas are arbitrary JSON, which a
Parquet struct cannot hold); token ids are `list<uint32>`, the loss mask `list<uint8>`. Read it with
pyarrow (`pq.read_table(path).to_pylist()`) or `datasets.load_dataset("parquet", data_files=path)`.
`from_parquet_row` turns a row back into the JSONL form.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FORMATS = ("chat-jsonl", "parquet")
_MESSAGE_KEYS = ("role", "content", "name", "reasoning_content", "tool_call_id")


def write_jsonl(records: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def _schema() -> Any:
    import pyarrow as pa

    function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    tool_call = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
    message = pa.struct([*((key, pa.string()) for key in _MESSAGE_KEYS), ("tool_calls", pa.list_(tool_call))])
    tool_function = pa.struct([("name", pa.string()), ("description", pa.string()), ("parameters", pa.string())])
    tool = pa.struct([("type", pa.string()), ("function", tool_function)])
    return pa.schema(
        [
            ("run_id", pa.string()),
            ("session_id", pa.string()),
            ("task_id", pa.string()),
            ("call_sequence", pa.uint32()),
            ("reward", pa.float64()),
            ("policy_version", pa.uint64()),
            ("messages", pa.list_(message)),
            ("tools", pa.list_(tool)),
            ("token_ids", pa.list_(pa.uint32())),
            ("loss_mask", pa.list_(pa.uint8())),
        ]
    )


def _parquet_row(record: dict[str, Any]) -> dict[str, Any]:
    row = dict(record)
    row["tools"] = [
        {"type": t["type"], "function": {**t["function"], "parameters": json.dumps(t["function"]["parameters"])}}
        for t in record["tools"]
    ]
    return row


def write_parquet(records: Sequence[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([_parquet_row(r) for r in records], schema=_schema())
    pq.write_table(table, path)


def from_parquet_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row read back from the Parquet file, in the JSONL record form (absent optional keys dropped)."""
    out = dict(row)
    messages = []
    for message in row["messages"]:
        kept = {key: value for key, value in message.items() if value is not None}
        if not kept.get("tool_calls"):
            kept.pop("tool_calls", None)
        messages.append(kept)
    out["messages"] = messages
    out["tools"] = [
        {"type": t["type"], "function": {**t["function"], "parameters": json.loads(t["function"]["parameters"])}}
        for t in row["tools"]
    ]
    return out


def write(records: Sequence[dict[str, Any]], path: Path, fmt: str) -> None:
    """Write `records` to `path` in `fmt` (one of `FORMATS`)."""
    if fmt == "parquet":
        write_parquet(records, path)
    else:
        write_jsonl(records, path)
