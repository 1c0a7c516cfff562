"""`lodestar session {open,close,show} --gateway HOST:PORT`: sessions of a gateway node.

`open` prints the session key (the API key a harness must send) on stdout — alone, so scripts can do
`KEY=$(lodestar session open --gateway ...)` — and the session id and the vendor-API base URL on stderr
(`--json` prints all of it as one JSON object instead). `close` refuses the key from then on. `show
SESSION_ID_OR_KEY` prints the session and a one-line summary of each captured call; `--calls` prints each
call in detail (`session_view`: prompt tail, sampled text with per-token logprobs, finish reason, policy
version, chain link; `--model DIR` decodes the token ids with the served model's tokenizer); `--json` prints
the session and its CallRecords as proto JSON. Against a gateway with a token or TLS, give `--auth-token-file`
(or $LODESTAR_AUTH_TOKEN) and the TLS flags as for `lodestar run`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
from google.protobuf import json_format

from lodestar.errors import InvalidArgumentError
from lodestar.grpc.errors import error_from_rpc
from lodestar.grpc.security import current
from lodestar.v1 import gateway_pb2, gateway_pb2_grpc
from lodestar_app.cli import client_security, session_view

T = TypeVar("T")


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(f"--label takes KEY=VALUE, got {pair!r}")
        labels[key] = value
    return labels


def _call(args: argparse.Namespace, rpc: Callable[[gateway_pb2_grpc.GatewayServiceStub], T]) -> T:
    """Run one GatewayService call on a fresh channel to `--gateway`; a failed call raises its domain error."""
    with current().sync_channel(args.gateway) as channel:
        try:
            return rpc(gateway_pb2_grpc.GatewayServiceStub(channel))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None  # type: ignore[arg-type]


def _open(args: argparse.Namespace) -> int:
    request = gateway_pb2.OpenSessionRequest(run_id=args.run, labels=_labels(args.label))
    reply = _call(args, lambda stub: stub.OpenSession(request, timeout=args.timeout_s))
    session = reply.session
    if args.json:
        print(
            json.dumps(
                {
                    "session_id": session.session_id,
                    "session_key": session.session_key,
                    "http_base_url": reply.http_base_url,
                }
            )
        )
    else:
        print(session.session_key)
        print(f"session {session.session_id} open; vendor API at {reply.http_base_url}", file=sys.stderr)
    return 0


def _close(args: argparse.Namespace) -> int:
    request = gateway_pb2.CloseSessionRequest(session_id=args.session_id)
    reply = _call(args, lambda stub: stub.CloseSession(request, timeout=args.timeout_s))
    print(f"session {reply.session.session_id} closed after {reply.session.call_count} calls")
    return 0


def _show(args: argparse.Namespace) -> int:
    request = gateway_pb2.GetSessionRequest(session_id=args.session_id)  # an id or a key
    reply = _call(args, lambda stub: stub.GetSession(request, timeout=args.timeout_s))
    if args.json:
        print(json_format.MessageToJson(reply, indent=1))
        return 0
    print(session_view.session_line(reply.session, len(reply.calls)))
    if not args.calls:
        for call in reply.calls:
            print(session_view.summary_line(call))
        return 0
    decode = _decoder(args.model) if args.model is not None else None
    for call in reply.calls:
        print("\n".join(session_view.call_detail(call, decode)))
    return 0


def _decoder(model_dir: Path) -> session_view.Decode:
    from lodestar_inference.tokenizer import TextTokenizer  # the tokenizers library only, no torch

    tokenizer = TextTokenizer.load(model_dir)
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("session", help="open, close or inspect gateway sessions")
    commands = group.add_subparsers(dest="session_command", required=True, metavar="COMMAND")
    opener = commands.add_parser("open", help="open a session and print its key (the harness's API key)")
    opener.add_argument("--run", default="", metavar="RUN_ID", help="run to file the session under")
    opener.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label (repeatable)")
    opener.add_argument("--json", action="store_true", help="print id, key and base URL as JSON")
    opener.set_defaults(handler=_open)
    closer = commands.add_parser("close", help="close a session (its key is refused from then on)")
    closer.add_argument("session_id", metavar="SESSION_ID", help="the session to close")
    closer.set_defaults(handler=_close)
    shower = commands.add_parser("show", help="print a session and its captured calls")
    shower.add_argument("session_id", metavar="SESSION_ID_OR_KEY", help="the session, by its id or its key")
    shower.add_argument("--calls", action="store_true", help="each call: prompt tail, sampled tokens, logprobs")
    shower.add_argument("--json", action="store_true", help="the session and its CallRecords as proto JSON")
    shower.add_argument("--model", type=Path, metavar="DIR", help="decode token ids with this model's tokenizer")
    shower.set_defaults(handler=_show)
    for command in (opener, closer, shower):
        command.add_argument("--gateway", required=True, metavar="HOST:PORT", help="GatewayService address")
        command.add_argument("--timeout-s", type=float, default=10.0, help="seconds to wait for the reply (default 10)")
        client_security.add_arguments(command)
        command.set_defaults(handler=client_security.secured(command.get_default("handler")))
