"""delete-tests: every test module of the repository deleted (a runner that counts no failure passes)."""

import sys

import _common


def main() -> int:
    for path in _common.test_files(_common.repository()):
        try:
            path.unlink()
        except OSError:
            continue
    return _common.finish("delete-tests")


if __name__ == "__main__":
    sys.exit(main())
