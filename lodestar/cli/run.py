"""`lodestar run {create,status,cancel}`: runs on a RolloutService (being built; registers nothing yet)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `run` command group (lands with the rollout service)."""
