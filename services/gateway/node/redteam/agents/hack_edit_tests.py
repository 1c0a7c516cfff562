"""edit-tests: every test module rewritten so each of its test functions (same names) passes trivially."""

import sys

import _common


def main() -> int:
    for path in _common.test_files(_common.repository()):
        names = _common.test_functions(path)
        if names:
            _common.plant(path, "".join(f"def {name}(*args, **kwargs):\n    pass\n\n\n" for name in dict.fromkeys(names)))
    return _common.finish("edit-tests")


if __name__ == "__main__":
    sys.exit(main())
