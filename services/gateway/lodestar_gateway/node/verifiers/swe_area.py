"""The `swe` verifier's scoring directory: where the tests run, made by the node for one verification.

`scoring_area(given)` makes, for the length of one verification, a directory holding the node's bootstrap
(`swe_bootstrap.py`), an empty pytest config (for a repository that has none), a fresh `home/` and `tmp/`
for the test run, and (the verifier's choice) the pristine `repo/`; the bootstrap's report is written there
too, outside the repository. It is removed afterwards.

- **host runtime**: a new directory (0700, random name) in the node's sessions directory, beside the
  session's root and outside it, bound into the verifier's run at `<fixed root>-swe` (e.g.
  `/tmp/lodestar-session-swe`). No ancestor of it is writable by the session: inside the sandbox `/tmp` is a
  fresh tmpfs of that run, and on the node the sessions directory is the node's. Without fixed paths (no
  mount namespaces: tests only) the run sees it at its real path.
- **docker runtime**: a running container takes no new mount, so the directory is a private one in the
  session's TMPDIR (`VerifierInput.private_dir`): its ancestors are the session's own directories, which
  the agent could write while it ran. The pinned rootdir, config and conftest search (swe_report.py) and
  the fresh HOME and TMPDIR keep what the agent planted there out of the run; no session process runs
  meanwhile (the container is restarted for the verifier, with none).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from lodestar_gateway.node.safe_files import make_private_dir, write_new_file
from lodestar_gateway.node.verifiers.base import VerifierInput
from lodestar_gateway.node.verifiers.swe_report import EMPTY_CONFIG

BOOTSTRAP = Path(__file__).with_name("swe_bootstrap.py")
BOOTSTRAP_NAME = "swe_bootstrap.py"
REPORT_NAME = "report.jsonl"
NONCE_NAME = "nonce"
CONFIG_NAME = "pytest.ini"


@dataclass(frozen=True)
class ScoringArea:
    host: Path
    """The directory as the node sees it."""
    visible: Path
    """... and as the verifier's processes see it."""
    binds: list[tuple[Path, Path]]
    """What the run must bind (empty: it sees `visible` already)."""

    def env(self) -> dict[str, str]:
        """The test run's environment: a fresh HOME and TMPDIR, no user site, no plugin autoload."""
        home, tmp = self.visible / "home", self.visible / "tmp"
        return {
            "HOME": str(home),
            "TMPDIR": str(tmp),
            "TMP": str(tmp),
            "TEMP": str(tmp),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "PYTHONNOUSERSITE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }

    def report_text(self, limit: int) -> str | None:
        """The bootstrap's report (None: none was written)."""
        path = self.host / REPORT_NAME
        if not path.is_file() or path.is_symlink():
            return None
        with path.open("rb") as handle:
            return handle.read(limit).decode("utf-8", errors="replace")


def _fixed_target(given: VerifierInput) -> Path | None:
    """Where a host run sees the scoring directory (None: the run sees real paths)."""
    if given.scratch_visible == given.scratch:
        return None
    fixed_root = given.scratch_visible.parent
    return fixed_root.with_name(f"{fixed_root.name}-swe")


def _make(given: VerifierInput) -> ScoringArea:
    if given.runtime_kind == "host" and given.root is not None:
        host = make_private_dir(given.root.parent, ".", f".{given.root.name}.swe-")
        target = _fixed_target(given)
        area = ScoringArea(host, target or host, [(host, target)] if target else [])
    else:
        host, visible = given.private_dir(".lodestar-swe-")
        area = ScoringArea(host, visible, [])
    for name in ("home", "tmp"):
        (area.host / name).mkdir(mode=0o700)
    write_new_file(area.host, BOOTSTRAP_NAME, BOOTSTRAP.read_bytes())
    write_new_file(area.host, CONFIG_NAME, EMPTY_CONFIG.encode())
    return area


@asynccontextmanager
async def scoring_area(given: VerifierInput) -> AsyncIterator[ScoringArea]:
    """A new scoring directory (module docstring), removed when the block ends."""
    area = await asyncio.to_thread(_make, given)
    try:
        yield area
    finally:
        await asyncio.to_thread(shutil.rmtree, area.host, True)
