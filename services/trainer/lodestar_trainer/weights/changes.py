"""Changed-only weight sync (`weights.changed_only`): each push carries only the tensors that changed since the
version the replicas serve, and a replica that does not serve that version gets the full state.

`Mirror` keeps the last version pushed, in the payload dtype (the replicas' serving dtype), in buffers
allocated once. `Mirror.take` compares each tensor of the new state, cast to that dtype, with its buffer,
bit for bit (so a tensor whose fp32 change rounds away in bf16 is not sent, and -0.0 against 0.0 or a NaN
is), copies the ones that differ, and returns a `Delta`: the whole new version (the buffers), the names
that changed, and the base version they changed from. The base is the version of the previous push once it
landed; after a push that failed, on the first push, or when the set of names, a shape or a dtype changed,
there is no base and the push is the full state.

The protocol makes a wrong diff impossible to apply: a changed-only update names its base
(`WeightsHeader.base_version`), and a replica that serves any other version (it missed one, restarted, or
another writer pushed to it) refuses it with FAILED_PRECONDITION before reading its bytes
(lodestar_inference/weights.py `check_base`). The transports (publish.py, shared_fs.py, broadcast.py) then
send that replica the full state of the same version; replicas they know to be behind get it at once.

When it pays: a full fine-tune's AdamW step changes nearly every tensor (its update is never exactly zero
where the moments are not), so a full fine-tune sends about as much as before plus one comparison pass.
It pays when parts of the model do not move: frozen layers or embeddings, buffers, an optimizer with
sparse updates, a step skipped or with learning rate 0, or updates smaller than the serving dtype's
resolution (docs/trainer.md "Changed-only sync" and docs/benchmarks.md measure it).

An empty diff (nothing changed) still carries the smallest tensor: a version always moves through the same
validated swap, and the replicas' version advances.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from safetensors.torch import save

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Delta:
    """One version to push: `state` is all of it (in the payload dtype), `changed` the names that differ from
    `base` (0: no base, only the full state may be sent)."""

    version: int
    state: Mapping[str, torch.Tensor]
    changed: tuple[str, ...]
    base: int
    started: float = field(default_factory=time.perf_counter)

    def changed_state(self) -> dict[str, torch.Tensor]:
        return {name: self.state[name] for name in self.changed}

    @property
    def diff_bytes(self) -> int:
        """Tensor bytes of the changed-only payload (the full state's when there is no base)."""
        names = self.changed if self.base else tuple(self.state)
        return sum(self.state[name].numel() * self.state[name].element_size() for name in names)


class Payloads:
    """The serialized payloads of one `Delta`, each built once on first use (any thread): the changed-only one
    for replicas at the base, the full one only if some replica needs it."""

    def __init__(self, delta: Delta) -> None:
        self.delta = delta
        self._lock = threading.Lock()
        self._diff: bytes | None = None
        self._full: bytes | None = None

    def diff(self) -> bytes:
        with self._lock:
            if self._diff is None:
                self._diff = save(self.delta.changed_state())
            return self._diff

    def full(self) -> bytes:
        with self._lock:
            if self._full is None:
                self._full = save(dict(self.delta.state))
            return self._full

    @property
    def full_bytes(self) -> int:
        """Bytes of the full payload, 0 when none was built (every replica took the diff)."""
        return len(self._full) if self._full is not None else 0


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s memory as integers of its item size: equal exactly when bit for bit equal."""
    if tensor.is_floating_point() and tensor.element_size() in _BITS:
        return tensor.view(_BITS[tensor.element_size()])
    return tensor


class Mirror:
    """The last version pushed, in the payload dtype (see the module docstring)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self.version = 0
        """The version the buffers hold and the replicas were sent (0: none confirmed: the next push is full)."""

    def take(self, state: Mapping[str, torch.Tensor], dtype: torch.dtype | None, version: int) -> Delta:
        """Copy what changed in `state` (cast to `dtype`) into the buffers; the Delta to push as `version`.
        The buffers are what the push sends: the next `take` must wait until it is done."""
        started = time.perf_counter()
        base = self.version if set(state) == set(self._buffers) else 0
        self.version = 0  # until `confirm`: a push that fails leaves no base behind
        changed: list[str] = []
        with torch.no_grad():
            for name, given in state.items():
                tensor = given.detach()
                want = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
                buffer = self._buffers.get(name)
                if buffer is None or buffer.shape != tensor.shape or buffer.dtype != want:
                    self._buffers[name] = torch.empty(tensor.shape, dtype=want, device="cpu").copy_(tensor)
                    base = 0
                    changed.append(name)
                    continue
                cast = tensor.to(device="cpu", dtype=want)
                if not torch.equal(_bits(cast), _bits(buffer)):
                    buffer.copy_(cast)
                    changed.append(name)
        for gone in set(self._buffers) - set(state):
            del self._buffers[gone]
        if not changed and state:
            changed.append(min(state, key=lambda name: self._buffers[name].numel()))
        taken = {name: self._buffers[name] for name in state}
        return Delta(version, taken, tuple(changed), base, started)

    def confirm(self, version: int) -> None:
        """The push of `version` landed: it is the base of the next diff."""
        self.version = version
