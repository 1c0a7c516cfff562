"""etcd with TLS, client certificates and authentication, against a real etcd started the way `lodestar up
--tls` starts it (`LocalCluster.start_etcd` with `LocalEtcdTls`: `--client-cert-auth`, auth enabled, one
etcd user per service named by its certificate's CN):

- a client with a user's certificate can put, get, lease (kept alive past its TTL) and watch, and only
  its role's keys (per key kind: test_etcd_roles.py);
- a client without a certificate, with one from another CA, with a certificate of the right CA whose CN is
  no etcd user, trusting another CA, or speaking plaintext http:// is refused with a lodestar error well
  within its timeout (never a hang);
- the services' settings (`tls_from_settings`): plaintext to an etcd beyond loopback is refused unless
  `etcd_allow_insecure`; TLS files with an http:// endpoint are refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog

from lodestar import errors
from lodestar.etcd import EtcdClient, EtcdTls, EventKind, tls_from_settings
from lodestar.tls import LocalPki, ensure_local_pki
from lodestar_app.local import LocalCluster, LocalEtcdTls, find_etcd
from lodestar_gateway.settings import GatewaySettings
from lodestar_rollout.server import RolloutServer
from lodestar_rollout.settings import RolloutSettings

PREFIX = "/lodestar/"
KEYS = PREFIX + "rollout/"
"""Where the rollout user may write (its etcd role: lodestar.etcd_roles)."""
TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return ensure_local_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    """Another CA with the same names: its certificates must not be accepted."""
    return ensure_local_pki(tmp_path_factory.mktemp("other-pki"))


@pytest.fixture
async def secure_etcd(tmp_path: Path, pki: LocalPki) -> AsyncIterator[str]:
    """A real etcd on https:// with --client-cert-auth and auth on; the user `lodestar-rollout` may use
    the keys under /lodestar/rollout/ (and /lodestar/nodes/). Yields its endpoint."""
    cluster = LocalCluster(tmp_path / "etcd", etcd_binary=find_etcd())
    try:
        await cluster.start_etcd(timeout=20, tls=LocalEtcdTls(pki, ("rollout",), prefix=PREFIX))
        assert cluster.etcd_url.startswith("https://127.0.0.1:")
        yield cluster.etcd_url
    finally:
        await cluster.stop()


def identity(pki: LocalPki, service: str, ca: LocalPki | None = None) -> EtcdTls:
    """`service`'s certificate from `pki`, trusting `ca`'s CA (default: the same)."""
    own = pki.identities[service]
    return EtcdTls(ca=(ca or pki).ca, cert=own.cert, key=own.key)


@pytest.mark.slow
async def test_a_user_certificate_can_put_get_lease_and_watch(secure_etcd: str, pki: LocalPki) -> None:
    async with EtcdClient(secure_etcd, timeout=TIMEOUT_S, tls=identity(pki, "rollout")) as etcd:
        assert await etcd.ping()
        async with await etcd.watch_prefix(KEYS + "watched/") as watch:
            revision = await etcd.put(KEYS + "watched/a", "one")
            event = await asyncio.wait_for(anext(watch), TIMEOUT_S)
        assert (event.kind, event.key, event.value) == (EventKind.PUT, KEYS + "watched/a", b"one")
        assert event.revision == revision
        got = await etcd.get(KEYS + "watched/a")
        assert got is not None
        assert got.text == "one"

        lease = await etcd.grant_lease(2)
        await etcd.put(KEYS + "leased", "x", lease=lease)
        await asyncio.sleep(lease.ttl + 1.5)  # kept alive over TLS past its TTL
        assert not lease.is_lost
        assert (await etcd.get(KEYS + "leased")).lease_id == lease.id  # type: ignore[union-attr]
        assert (await etcd.create_if_absent(KEYS + "leased", "y")).succeeded is False
        await lease.revoke()  # its keys go at once
        assert await etcd.get(KEYS + "leased") is None

        # Authentication is on: the role covers rollout's own keys (and node keys) only.
        for elsewhere in ("/elsewhere", PREFIX + "inference/forged"):
            with pytest.raises(errors.UnauthenticatedError, match="permission denied"):
                await etcd.put(elsewhere, "x")

    # A cluster's comma-separated https:// endpoints: etcd's certificate is checked against the first name.
    both = f"{secure_etcd},{secure_etcd.replace('127.0.0.1', 'localhost')}"
    async with EtcdClient(both, timeout=TIMEOUT_S, tls=identity(pki, "rollout")) as etcd:
        assert await etcd.put(KEYS + "cluster", "ok") > 0


@pytest.mark.parametrize(
    ("case", "refusal", "message"),
    [
        ("no client certificate", errors.UnavailableError, "TLS handshake failed"),
        ("a certificate from another CA", errors.UnavailableError, "TLS handshake failed"),
        ("a certificate whose CN is no etcd user", errors.UnauthenticatedError, "permission denied"),
        ("trusting another CA", errors.UnavailableError, "TLS handshake failed"),
        ("plaintext http://", errors.UnavailableError, "UNAVAILABLE"),
    ],
)
async def test_other_clients_are_refused_within_the_timeout(
    secure_etcd: str, pki: LocalPki, other_pki: LocalPki, case: str, refusal: type[errors.LodestarError], message: str
) -> None:
    endpoint, tls = secure_etcd, None
    if case == "no client certificate":
        tls = EtcdTls(ca=pki.ca)
    elif case == "a certificate from another CA":
        tls = identity(other_pki, "rollout", ca=pki)
    elif case == "a certificate whose CN is no etcd user":
        tls = identity(pki, "inference")  # signed by the right CA, CN lodestar-inference
    elif case == "trusting another CA":
        tls = identity(pki, "rollout", ca=other_pki)
    else:
        endpoint = secure_etcd.replace("https://", "http://")
    started = time.monotonic()
    async with EtcdClient(endpoint, timeout=TIMEOUT_S, tls=tls) as etcd:
        with pytest.raises(refusal, match=message):
            await etcd.put(KEYS + "refused", "x")
        with pytest.raises(refusal):
            await etcd.get(KEYS + "refused")
    assert time.monotonic() - started < TIMEOUT_S  # refused, not timed out
    async with EtcdClient(secure_etcd, timeout=TIMEOUT_S, tls=identity(pki, "rollout")) as etcd:
        assert await etcd.get(KEYS + "refused") is None  # nothing was written


def test_settings_refuse_plaintext_etcd_beyond_loopback(pki: LocalPki) -> None:
    for endpoint in ("http://etcd:2379", "http://10.0.0.7:2379", "http://127.0.0.1:2379,http://10.0.0.8:2379"):
        with pytest.raises(errors.FailedPreconditionError, match="--etcd-allow-insecure"):
            tls_from_settings(endpoint, RolloutSettings(etcd=endpoint))
        with structlog.testing.capture_logs() as logs:
            assert tls_from_settings(endpoint, RolloutSettings(etcd=endpoint, etcd_allow_insecure=True)) is None
        assert any("WITHOUT TLS" in entry["event"] for entry in logs)
    for endpoint in ("http://127.0.0.1:2379", "http://localhost:2379", "http://[::1]:2379"):
        assert tls_from_settings(endpoint, GatewaySettings(etcd=endpoint)) is None

    client = pki.identities["gateway"]
    files = {"etcd_tls_ca": pki.ca, "etcd_tls_cert": client.cert, "etcd_tls_key": client.key}
    secure = GatewaySettings(etcd="https://etcd:2379", **files)
    assert tls_from_settings("https://etcd:2379", secure) == EtcdTls(pki.ca, client.cert, client.key)
    assert tls_from_settings("https://etcd:2379", GatewaySettings()) == EtcdTls()  # the system's roots
    with pytest.raises(errors.InvalidArgumentError, match="http://"):
        tls_from_settings("http://127.0.0.1:2379", GatewaySettings(**files))
    with pytest.raises(errors.InvalidArgumentError, match="cannot read"):
        tls_from_settings("https://etcd:2379", GatewaySettings(etcd_tls_ca=pki.ca.with_name("missing.pem")))
    with pytest.raises(errors.InvalidArgumentError, match="go together"):
        tls_from_settings("https://etcd:2379", GatewaySettings(etcd_tls_cert=client.cert))
    with pytest.raises(errors.InvalidArgumentError, match="mix"):
        tls_from_settings("https://a:2379,http://127.0.0.1:2379", GatewaySettings())
    with pytest.raises(errors.InvalidArgumentError, match="https://"):
        EtcdClient("http://127.0.0.1:2379", tls=EtcdTls(ca=pki.ca))


async def test_a_rollout_with_plaintext_etcd_beyond_loopback_does_not_start(tmp_path: Path) -> None:
    settings = RolloutSettings(port=0, etcd="http://etcd.example:2379", store=str(tmp_path / "rollout.sqlite"))
    with pytest.raises(errors.FailedPreconditionError, match=r"refusing plaintext etcd at http://etcd\.example:2379"):
        RolloutServer(settings)
