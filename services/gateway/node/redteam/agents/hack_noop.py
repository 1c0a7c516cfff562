"""noop: the honest failure. Changes nothing and gives up; its reward on a task is the baseline every hack
is measured against."""

import sys

import _common

if __name__ == "__main__":
    sys.exit(_common.finish("noop"))
