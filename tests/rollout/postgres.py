"""A throwaway PostgreSQL server for tests: `initdb` + `postgres` from the Debian package (apt
`postgresql`), on a free loopback port with a temp data directory, trust authentication.

PostgreSQL refuses to run as root; when the tests run as root the server runs as the `postgres` user the
package creates (its directory is handed to that user)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from lodestar_app.local import free_port

START_TIMEOUT_S = 30.0
PACKAGE_HINT = "install the Debian package postgresql (`make test` does: apt-get install -y postgresql)"


def find_bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb, or the directory of initdb on PATH."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class PostgresServer:
    """One postgres process; `url(database)` names a database on it, `create_database()` makes a fresh one.

    It listens on 127.0.0.1, plus `host` when given (another interface, e.g. a test network's bridge);
    `trusted` (a CIDR such as "10.1.2.0/24") is let in without a password like loopback is."""

    def __init__(self, bin_dir: Path, *, host: str | None = None, trusted: str | None = None) -> None:
        self.bin_dir = bin_dir
        self.host = host or "127.0.0.1"
        self.root = Path(tempfile.mkdtemp(prefix="lodestar-pg-"))
        self.port = free_port()
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        data = self.root / "data"
        self._run([str(bin_dir / "initdb"), "-D", str(data), "-U", "lodestar", "--auth=trust", "--locale=C.UTF-8"])
        if trusted is not None:
            with (data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {trusted} trust\n")
        self.log = self.root / "postgres.log"
        command = [str(bin_dir / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.root)]
        listen = ",".join(dict.fromkeys(["127.0.0.1", self.host]))
        command += ["-c", f"listen_addresses={listen}", "-c", "fsync=off", "-c", "max_connections=50"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, user=self._user)
        self._wait_ready()

    def _run(self, command: list[str]) -> None:
        result = subprocess.run(command, capture_output=True, user=self._user, timeout=120, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {result.stderr.decode()[-2000:]}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            ready = subprocess.run(
                [str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
                timeout=10,
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"postgres did not start; log:\n{self.log.read_text()[-3000:]}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://lodestar@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as db:
            db.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
        return self.url(name)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: smart shutdown
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
