"""The process groups of a node's runs, recorded in its data dir, so a node that starts ends what a killed one left.

Every run (harness or verifier) starts a session of its own: its first process's pid is the session and process
group id, and the launcher kills the group on every exit path. A node SIGKILLed mid-run cannot: the namespace
helper dies with it (its parent-death signal), but a process that has no such signal yet lives on. The chaos hour
left one that way: bubblewrap's clone child, blocked in its set-up reading the go-ahead of a parent that was gone
(docs/chaos.md). So the launcher records each running group (`<dir>/<pgid>`, holding the machine's boot id) and
removes the record once the group is ended; a node that starts SIGKILLs every process still in a group recorded
during this boot whose session is that group too, then forgets every record.

Linux hands no new process a pid that still names a live process group or session, so a recorded group that
still has members is the run's own. A group whose members all died frees its pid, which a new process could get
only after the pid space wraps (`/proc/sys/kernel/pid_max`) between the node's death and its next start.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from lodestar.logging import get_logger

_log = get_logger("gateway.harnesses.run_groups")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class RunGroups:
    """The record of a node's running process groups (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._boot = _boot_id()

    def started(self, pgid: int) -> None:
        (self.directory / str(pgid)).write_text(self._boot)

    def ended(self, pgid: int) -> None:
        (self.directory / str(pgid)).unlink(missing_ok=True)

    def kill_leftovers(self) -> int:
        """SIGKILL every process left in a group recorded this boot and never ended; forget every record.
        Returns how many processes were signalled."""
        recorded: set[int] = set()
        for path in self.directory.iterdir():
            with contextlib.suppress(OSError):
                if path.name.isdigit() and path.read_text().strip() == self._boot:
                    recorded.add(int(path.name))
                path.unlink()
        killed = 0
        for pid, pgid, sid in live_processes():
            if pgid in recorded and sid == pgid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        if killed:
            _log.warning("killed what an earlier node process left running", processes=killed, groups=len(recorded))
        return killed


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def live_processes() -> Iterator[tuple[int, int, int]]:
    """(pid, process group, session) of every live (non-zombie) process this node can see."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and fields[0] != "Z":
            yield int(entry.name), int(fields[2]), int(fields[3])
