"""`exact_match` verifier: the final answer against the task's `metadata.answer`.

The final answer is the text of the session's last assistant completion (reasoning excluded). Both sides
are normalized before comparing: Unicode NFKC, case folded (unless config {"case_sensitive": true}),
whitespace runs collapsed to one space, surrounding whitespace, quotes/backticks and one trailing period
removed. `metadata.answer` may be a string, a number or a list of accepted answers; config {"field": F}
reads `metadata.F` instead. Reward 1.0 on a match, else 0.0. A task without the field is a VerifierError
(a bad dataset must not train as reward 0).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from lodestar.errors import InvalidArgumentError
from lodestar_gateway.node.verifiers.base import Verdict, VerifierError, VerifierInput, task_metadata

_SPACES = re.compile(r"\s+")


def normalize(text: str, *, case_sensitive: bool = False) -> str:
    out = unicodedata.normalize("NFKC", text)
    out = _SPACES.sub(" ", out).strip()
    if not case_sensitive:
        out = out.casefold()
    out = out.strip("\"'`").strip()
    if out.endswith("."):
        out = out[:-1].rstrip()
    return out


class ExactMatchVerifier:
    kind = "exact_match"

    def __init__(self, config: dict[str, Any]) -> None:
        field = config.get("field", "answer")
        if not isinstance(field, str) or not field:
            raise InvalidArgumentError("exact_match verifier: field must be a non-empty string")
        self.field = field
        self.case_sensitive = bool(config.get("case_sensitive", False))

    async def score(self, given: VerifierInput) -> Verdict:
        metadata = task_metadata(given.task)
        if self.field not in metadata:
            raise VerifierError(f"exact_match: task {given.task.task_id!r} has no metadata.{self.field}")
        raw = metadata[self.field]
        expected = [_text(item) for item in (raw if isinstance(raw, list) else [raw])]
        got = normalize(given.final_answer, case_sensitive=self.case_sensitive)
        matched = next((item for item in expected if normalize(item, case_sensitive=self.case_sensitive) == got), None)
        details = {"kind": self.kind, "normalized_answer": got[:2000], "expected": expected[:20], "matched": matched}
        return Verdict(1.0 if matched is not None else 0.0, details)


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # Struct numbers are doubles: 4 arrives as 4.0
    return str(value)
