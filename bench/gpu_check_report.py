"""bench/gpu_check.py's run record: the device, the budget, the rows so far (a markdown table rewritten after
each row) and the guard that turns a section's exception into an `error` row."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console


@dataclass
class Row:
    section: int
    check: str
    result: str
    """pass, FAIL, measured, skipped or error."""
    detail: str


@dataclass
class Check:
    """The run: device, budget, the rows so far (written out after each one), where progress lines go."""

    device: torch.device
    budget_s: float
    out: Path | None
    console: Console
    workdir: Path
    group_size: int
    sample: int
    peak_tflops: float | None
    started: float = field(default_factory=time.perf_counter)
    rows: list[Row] = field(default_factory=list)
    predicted: float = 0.0
    """Section 4: the step's peak GiB step/memory.py predicts for the model being measured (0: none)."""

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def add(self, section: int, check: str, result: str, detail: str) -> None:
        self.rows.append(Row(section, check, result, detail))
        style = {"pass": "green", "measured": "cyan", "skipped": "yellow"}.get(result, "bold red")
        self.console.log(f"[{self.elapsed():5.0f}s] {section}. {check}: [{style}]{result}[/] {detail}")
        if self.out is not None:
            self.out.write_text(table(self.rows))

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def table(rows: list[Row]) -> str:
    """The rows in the order they ran (sections 1, 4, 2, 3, 5 by default: the 4B rows early)."""
    lines = ["| # | check | result | detail |", "|---|---|---|---|"]
    for row in rows:
        detail = row.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row.section} | {row.check} | {row.result} | {detail} |")
    return "\n".join(lines) + "\n"


def guarded(check: Check, section: int, name: str, run: Callable[[], None]) -> None:
    """Run one section; an exception becomes an `error` row (the rest of the run goes on)."""
    try:
        run()
    except Exception as error:  # the one run on a GPU must bring back every other row
        check.add(section, name, "error", f"{type(error).__name__}: {str(error)[:300]}")
        check.console.print_exception(max_frames=4)
    finally:
        if check.cuda:
            torch.cuda.empty_cache()
