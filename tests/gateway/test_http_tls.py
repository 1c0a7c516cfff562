"""The vendor-API HTTP port over TLS (--http-tls-cert/--http-tls-key, certificates from lodestar.tls),
and the warning a gateway logs when that port is bound beyond loopback without TLS."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx2 as httpx
import pytest
from openai import OpenAI

from lodestar.tls import ensure_local_pki
from lodestar_gateway.http_tls import exposure_warning, is_loopback
from tests.gateway.conftest import StackFactory


def test_only_loopback_or_tls_is_quiet() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert exposure_warning("127.0.0.1", tls=False) is None
    assert exposure_warning("0.0.0.0", tls=True) is None
    for host in ("0.0.0.0", "", "10.1.2.3", "gateway.internal"):
        warning = exposure_warning(host, tls=False)
        assert warning is not None
        assert "without TLS" in warning


def test_a_chat_completion_over_https(
    gateway_stack_factory: StackFactory, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pki = ensure_local_pki(tmp_path / "pki")
    gateway = pki.identities["gateway"]
    stack = gateway_stack_factory(http_host="0.0.0.0", http_tls_cert=gateway.cert, http_tls_key=gateway.key)
    assert stack.http_base_url.startswith("https://")
    port = stack.http_base_url.rsplit(":", 1)[1]
    session = stack.open_session(test="https")
    with httpx.Client(verify=ssl.create_default_context(cafile=pki.ca), timeout=30) as http:
        client = OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key=session.key, http_client=http)
        reply = client.chat.completions.create(model="lodestar", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets no answer
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).raise_for_status()
    assert "without TLS" not in capfd.readouterr().out


def test_an_exposed_plaintext_port_warns(
    gateway_stack_factory: StackFactory, capfd: pytest.CaptureFixture[str]
) -> None:
    gateway_stack_factory(http_host="0.0.0.0")
    out = capfd.readouterr()
    assert "bound to 0.0.0.0 without TLS" in out.out + out.err
