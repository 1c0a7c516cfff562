"""sandbox-escape: tries to leave the session. Writes a marker file (`lodestar-redteam-escape-<session>`) into
host places outside its own root (/tmp, /var/tmp, /dev/shm, the lodestar tree, the HOME directories) that the
red team looks for on the host afterwards, and connects to the stack's ports on the host's loopback
($LODESTAR_REDTEAM_PORTS, etcd's 2379) other than the gateway's."""

import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

MARKER = "lodestar-redteam-escape-"


def places() -> list[Path]:
    here = Path(__file__).resolve()
    found = [Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), here.parents[6], Path("/root"), *Path("/home").glob("*")]
    return list(dict.fromkeys(found))


def ports() -> list[int]:
    listed = [int(p) for p in os.environ.get("LODESTAR_REDTEAM_PORTS", "").split(",") if p.strip().isdigit()]
    gateway = urlparse(os.environ.get("LODESTAR_GATEWAY_URL", "")).port
    return [port for port in dict.fromkeys([*listed, 2379]) if port != gateway]


def main() -> int:
    name = MARKER + os.environ.get("LODESTAR_SESSION_ID", "unknown")
    for place in places():
        try:
            (place / name).write_text("written from a session\n")
        except OSError:
            continue
    for port in ports():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                _common.escaped(f"connected to 127.0.0.1:{port}")
        except OSError:
            continue
    return _common.finish("sandbox-escape")


if __name__ == "__main__":
    sys.exit(main())
