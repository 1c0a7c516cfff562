"""The kind names of a run spec — harness, verifier and runtime — and their validation, in one place.

Rollout refuses a spec with an unknown kind at CreateRun (`lodestar_rollout/spec.py`); the gateway node maps
each kind to its launcher adapter, verifier and runtime (`lodestar_gateway/node/`). Both use this module, so
what rollout accepts is exactly what a node can run.

Harness kinds (`HarnessSpec.kind`): `claude_code`, `codex`, `qwen_code`, `gemini_cli`, `pi`, `opencode`,
`continue_cli`, `cline`, `mini_swe_agent`, `aider`, `open_interpreter`, `openhands`, `command` (the program in
`HarnessSpec.command`), and `pi:<api>`. One spelling each: the node's launchers carry the same names, and a
kind spelled with '-' (`claude-code`) is refused with the right spelling in the error.

Pi speaks one of four vendor APIs (`PI_APIS`). `pi` alone speaks OpenAI Chat (`openai-completions`) unless
`HarnessSpec.env` sets `LODESTAR_PI_API` to another API; `pi:<api>` names the API in the kind itself and means
the same as `pi` with `LODESTAR_PI_API=<api>` (the kind is also what per-harness metrics are keyed by, so
`pi:<api>` keeps each API's sessions apart there). An unknown API, or a `pi:<api>` kind whose
`LODESTAR_PI_API` names another API, is refused: a spec never silently runs Pi on an API it did not ask for.
"""

from __future__ import annotations

from typing import Literal

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2

COMMAND = "command"
"""The harness (and verifier) kind that runs a program of the spec's own."""
PI = "pi"
HARNESS_KINDS: tuple[str, ...] = (
    "claude_code",
    "codex",
    "qwen_code",
    "gemini_cli",
    PI,
    "opencode",
    "continue_cli",
    "cline",
    "mini_swe_agent",
    "aider",
    "open_interpreter",
    "openhands",
    COMMAND,
)
"""Every harness kind but the `pi:<api>` spellings (`harness_kinds()` lists those too)."""

PiApi = Literal["openai-completions", "openai-responses", "anthropic-messages", "google-generative-ai"]
PI_APIS: tuple[PiApi, ...] = (
    "openai-completions",
    "openai-responses",
    "anthropic-messages",
    "google-generative-ai",
)
DEFAULT_PI_API: PiApi = "openai-completions"
PI_API_VARIABLE = "LODESTAR_PI_API"
"""`HarnessSpec.env` entry that picks Pi's API for kind `pi`."""

VERIFIER_KINDS: tuple[str, ...] = (COMMAND, "exact_match", "python", "swe")
RUNTIME_KINDS: tuple[str, ...] = ("host", "docker")
DEFAULT_RUNTIME_KIND = "host"
"""The runtime of a spec whose `RuntimeSpec.kind` is empty."""


def harness_kinds() -> tuple[str, ...]:
    """Every accepted `HarnessSpec.kind`, `pi:<api>` included."""
    return (*HARNESS_KINDS, *(f"{PI}:{api}" for api in PI_APIS))


def pi_api(spec: rollout_pb2.HarnessSpec) -> PiApi | None:
    """The API Pi speaks for `spec` (None when the harness is not Pi); InvalidArgumentError for an unknown
    API or a kind and `LODESTAR_PI_API` that name different APIs."""
    base, colon, in_kind = spec.kind.partition(":")
    if base != PI:
        return None
    in_env = spec.env.get(PI_API_VARIABLE)
    if colon and in_env is not None and in_env != in_kind:
        raise InvalidArgumentError(
            f"harness kind {spec.kind!r} and env {PI_API_VARIABLE}={in_env!r} name different Pi APIs: give one"
        )
    return parse_pi_api(in_kind if colon else (in_env if in_env is not None else DEFAULT_PI_API))


def parse_pi_api(text: str) -> PiApi:
    """`text` as one of `PI_APIS`; InvalidArgumentError for anything else."""
    for api in PI_APIS:
        if api == text:
            return api
    raise InvalidArgumentError(f"unknown Pi API {text!r} (expected one of {', '.join(PI_APIS)})")


def kind_hint(kind: str) -> str:
    """ " (kinds are spelled with '_': 'claude_code')" for a known kind spelled with '-' ('claude-code'), else ""."""
    spelled = kind.replace("-", "_")
    if spelled != kind and spelled in HARNESS_KINDS:
        return f" (kinds are spelled with '_': {spelled!r})"
    return ""


def validate_harness(spec: rollout_pb2.HarnessSpec) -> None:
    """InvalidArgumentError for an unknown kind, a `command` harness without a command, or a bad Pi API."""
    if spec.kind not in HARNESS_KINDS and not spec.kind.startswith(f"{PI}:"):
        raise InvalidArgumentError(
            f"unknown harness kind {spec.kind!r}{kind_hint(spec.kind)} "
            f"(expected one of {', '.join(HARNESS_KINDS)}, or {PI}:<api>)"
        )
    if spec.kind == COMMAND and not spec.command:
        raise InvalidArgumentError("harness kind 'command' needs harness.command (the program and its arguments)")
    pi_api(spec)


def validate_verifier_kind(kind: str) -> None:
    if kind not in VERIFIER_KINDS:
        raise InvalidArgumentError(f"unknown verifier kind {kind!r} (expected one of {', '.join(VERIFIER_KINDS)})")


def runtime_kind(spec: rollout_pb2.RuntimeSpec) -> str:
    """The runtime `spec` names (empty: `DEFAULT_RUNTIME_KIND`); InvalidArgumentError for an unknown one."""
    kind = spec.kind or DEFAULT_RUNTIME_KIND
    if kind not in RUNTIME_KINDS:
        raise InvalidArgumentError(f"unknown runtime kind {kind!r} (expected one of {', '.join(RUNTIME_KINDS)})")
    return kind
