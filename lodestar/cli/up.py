"""`lodestar up`: (being written) etcd plus all four services on loopback."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("up", help="run etcd and all four services locally")
    parser.set_defaults(handler=lambda args: 1)
