"""Moved to `services.gateway.node.runtimes` (one module per runtime kind); these names stay importable."""

from services.gateway.node.runtimes.base import DEFAULT_FIXED_ROOT
from services.gateway.node.runtimes.host import HostBackend as RuntimeFactory
from services.gateway.node.runtimes.host import HostRuntime as SessionRuntime

__all__ = ["DEFAULT_FIXED_ROOT", "RuntimeFactory", "SessionRuntime"]
