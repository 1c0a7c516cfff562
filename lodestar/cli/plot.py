"""`lodestar plot RUN_DIR`: reward and throughput curves as PNG (being built; registers nothing yet)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `plot` command (lands with the trainer)."""
