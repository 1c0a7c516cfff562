"""`lodestar auth tokens`, `lodestar auth pki` and `lodestar etcd setup-auth`: a deployment's credentials per
role (docs/deploy.md, "Credentials per role").

- `auth tokens DIR --node ID...` writes one token file per role (operator, trainer) and per gateway node
  (bound to its node id; without --node one `node` token all nodes share), and `DIR/tokens.sha256`, the
  digest table every server takes as `--auth-tokens-file` (`lodestar.credentials`). Existing tokens are
  kept; run it again to add a node.
- `auth pki DIR` makes a local CA and a certificate per service, etcd and the client (`lodestar.tls`, as
  `lodestar up --tls` does), for a deployment without a CA of its own (the compose stack).
- `etcd setup-auth --etcd https://... --node ID... --replica ID...` creates etcd's users and roles per key
  kind (`lodestar.etcd_roles`) and turns authentication on. Run it once against a fresh etcd with any client
  certificate of the CA, or later (to add nodes) with a certificate whose CN is `root`.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from lodestar.credentials import ensure_tokens, token_file_name
from lodestar.errors import UnauthenticatedError
from lodestar.etcd import EtcdClient, EtcdTls
from lodestar.etcd_roles import deployment_roles
from lodestar.presence import DEFAULT_PREFIX
from lodestar.tls import ensure_local_pki

BASE_ROLES = ("operator", "trainer")


def _tokens(args: argparse.Namespace) -> int:
    names = [*BASE_ROLES, *([f"node:{node}" for node in args.node] or ["node"])]
    table = ensure_tokens(args.directory, names)
    for name in names:
        print(f"{name:<24} {args.directory / token_file_name(name)}")
    print(f"{'servers (--auth-tokens-file)':<24} {table}")
    return 0


def _pki(args: argparse.Namespace) -> int:
    pki = ensure_local_pki(args.directory)
    print(f"CA {pki.ca}; certificates (CN lodestar-<name>): {', '.join(sorted(pki.identities))}")
    return 0


def _setup_auth(args: argparse.Namespace) -> int:
    roles = deployment_roles(args.etcd_prefix, nodes=args.node, replicas=args.replica)
    tls = EtcdTls(args.etcd_tls_ca, args.etcd_tls_cert, args.etcd_tls_key) if args.etcd.startswith("https") else None

    async def apply() -> None:
        async with EtcdClient(args.etcd, timeout=args.timeout_s, tls=tls) as etcd:
            await etcd.apply_auth(roles)

    try:
        asyncio.run(apply())
    except UnauthenticatedError:
        if not args.once:
            raise
        print("etcd authentication is already on (this certificate is not root): nothing changed")
        return 0
    for role in roles:
        grants = ", ".join(f"{'rw' if g.write else 'r'} {g.key}{'*' if g.prefix else ''}" for g in role.grants)
        print(f"{role.name:<32} {grants}")
    print("etcd authentication is on: each client is the user its certificate's CN names")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    auth = subparsers.add_parser("auth", help="control-plane credentials per role")
    auth_commands = auth.add_subparsers(dest="auth_command", required=True, metavar="COMMAND")
    tokens = auth_commands.add_parser("tokens", help="write token files per role and the servers' digest table")
    tokens.add_argument("directory", type=Path, help="where the token files and tokens.sha256 go (made 0700)")
    node_help = "a gateway node id (repeat; none: one node token all nodes share)"
    tokens.add_argument("--node", action="append", default=[], help=node_help)
    tokens.set_defaults(handler=_tokens)
    pki = auth_commands.add_parser("pki", help="a local CA and a certificate per service, etcd and the client")
    pki.add_argument("directory", type=Path, help="where ca.pem and <name>.pem, <name>-key.pem go (kept if there)")
    pki.set_defaults(handler=_pki)

    etcd = subparsers.add_parser("etcd", help="etcd administration")
    etcd_commands = etcd.add_subparsers(dest="etcd_command", required=True, metavar="COMMAND")
    setup = etcd_commands.add_parser("setup-auth", help="create etcd users and roles per key kind, enable auth")
    setup.add_argument("--etcd", required=True, help="etcd endpoint (https://host:port with the TLS flags)")
    setup.add_argument("--etcd-tls-ca", type=Path, default=None, help="CA of etcd's certificate")
    setup.add_argument("--etcd-tls-cert", type=Path, default=None, help="client certificate (CN root once auth is on)")
    setup.add_argument("--etcd-tls-key", type=Path, default=None, help="key of --etcd-tls-cert")
    setup.add_argument("--etcd-prefix", default=DEFAULT_PREFIX, help="root of lodestar's keys (default /lodestar/)")
    setup.add_argument("--node", action="append", default=[], help="a node with its own certificate (repeat)")
    setup.add_argument("--replica", action="append", default=[], help="a replica with its own certificate (repeat)")
    once_help = "succeed without changes when auth is already on (a compose stack's later starts)"
    setup.add_argument("--once", action="store_true", help=once_help)
    setup.add_argument("--timeout-s", type=float, default=10.0, help="seconds each etcd call may take (default 10)")
    setup.set_defaults(handler=_setup_auth)
