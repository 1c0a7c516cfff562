"""The weight broadcast's open c10d store, attacked with real gloo ranks against a real inference server
(transformers backend, tiny model): a stranger that reaches the store during a push lists its keys, finds the
group and takes a rank in it.

- In a replica's place (rank 1) it must get no byte of the weights, and the store must listen on the
  configured host only;
  the replica still ends up serving the trainer's version (over gRPC when the broadcast was spoiled);
- in the trainer's place (rank 0) it must not make a replica keep weights of its own (the receiving end,
  joined to a stranger's group as a replica would be).

The stranger in a replica's place is let in first by a hook (the real replica's call waits until it
joined), so the race an attacker would have to win is won every time.
"""

from __future__ import annotations

import datetime
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed

from lodestar.errors import UnavailableError
from lodestar.v1 import inference_pb2
from lodestar_app.local import free_port
from lodestar_inference.broadcast import receive_broadcast
from lodestar_trainer.model import dedupe_tied, load_model
from lodestar_trainer.weights.broadcast import BroadcastPublisher, bucket_sizes
from lodestar_trainer.weights.publish import serialize
from tests.trainer.inference_helpers import InferenceThread, greedy, served_version, trainer_logprobs

pytestmark = pytest.mark.slow
HANDSHAKE = "secret" in inference_pb2.WeightsBroadcast.DESCRIPTOR.fields_by_name
"""Whether the code under test authenticates its broadcasts (a stranger that knows the protocol speaks it:
gloo aborts the process on a message of the wrong size, which would end the test, not the attack)."""
c10d: Any = torch.distributed
TIMEOUT_S = 4.0
BUCKET_BYTES = 200_000


class _Stranger(threading.Thread):
    """Connects to the store at 127.0.0.1:`port`, waits for a push's group to appear among its keys, joins it
    as `rank` (gloo) and runs `act` with the group; `joined` is set once it is in (or gave up)."""

    def __init__(self, port: int, rank: int, act: Callable[[Any], None]) -> None:
        super().__init__(daemon=True)
        self.port, self.rank, self.act = port, rank, act
        self.joined = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        timeout = datetime.timedelta(seconds=TIMEOUT_S)
        try:
            store = c10d.TCPStore("127.0.0.1", self.port, None, False, datetime.timedelta(seconds=30))
            deadline = time.monotonic() + 30
            while not (keys := [key for key in store.list_keys() if key.startswith("lodestar-weights/")]):
                assert time.monotonic() < deadline, "no push appeared in the store"
                time.sleep(0.005)
            group_name = "/".join(keys[0].split("/")[:4])  # lodestar-weights/v<version>/<push>/<replica>
            options = c10d.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [c10d.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            prefixed = c10d.PrefixStore(group_name, store)
            self.joined.set()
            group = c10d.ProcessGroupGloo(prefixed, self.rank, 2, options)
            self.act(group)
        except BaseException as error:  # the stranger's failure is the test's data
            self.error = error
        finally:
            self.joined.set()


def _broadcast(group: Any, buffer: torch.Tensor, root: int = 0) -> None:
    options = c10d.BroadcastOptions()
    options.rootRank = root
    options.timeout = datetime.timedelta(seconds=TIMEOUT_S)
    group.broadcast([buffer], options).wait(options.timeout)


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) with a listening socket on `port`."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def _model(model_dir: Path, scale: float) -> Any:
    model = load_model(model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.eval()


def test_a_stranger_in_a_replicas_place_gets_no_weights(trainer_model_dir: Path, tmp_path: Path) -> None:
    """The stranger speaks the protocol the trainer does (with the handshake: a nonce and a guessed proof, as
    it cannot know the secret), then receives the first bucket."""
    model = _model(trainer_model_dir, 3.0)
    state = dedupe_tied(model, dict(model.state_dict()))
    payload = serialize(state)
    start, sizes = bucket_sizes(payload, BUCKET_BYTES)
    received: list[bytes] = []

    def steal(group: Any) -> None:
        if HANDSHAKE:
            _broadcast(group, torch.zeros(32, dtype=torch.uint8))  # the trainer's nonce
            _broadcast(group, torch.frombuffer(bytearray(secrets.token_bytes(64)), dtype=torch.uint8), root=1)
            _broadcast(group, torch.zeros(32, dtype=torch.uint8))  # the trainer's proof, if it sent one
        bucket = torch.zeros(sizes[0], dtype=torch.uint8)
        _broadcast(group, bucket)
        received.append(bytes(bucket))

    port = free_port()
    stranger = _Stranger(port, 1, steal)
    listening: list[set[str]] = []
    with InferenceThread.start(trainer_model_dir, tmp_path / "a") as replica:
        publisher = BroadcastPublisher(
            [replica.address], host="127.0.0.1", port=port, broadcast_timeout_s=TIMEOUT_S, bucket_bytes=BUCKET_BYTES
        )
        call_once = publisher.replicas.call_once

        def late_call(*args: Any) -> Any:  # the real replica joins after the stranger
            listening.append(_listening(port))
            stranger.joined.wait(30)
            return call_once(*args)

        publisher.replicas.call_once = late_call  # type: ignore[method-assign,assignment]
        try:
            stranger.start()
            version = publisher.served_version() + 1
            publisher.publish(state, version)
            stranger.join(30)
            assert received == [] or received[0] != payload[start : start + sizes[0]], "the stranger got weights"
            assert listening == [{"0100007F"}], f"the store listens beyond the configured host: {listening}"
            assert served_version(replica.address) == version
            final = greedy(replica.address)
            assert final.completion_logprobs == pytest.approx(trainer_logprobs(model, final), abs=1e-4)
        finally:
            publisher.close()


def test_a_stranger_in_the_trainers_place_cannot_make_a_replica_keep_its_weights(
    trainer_model_dir: Path, tmp_path: Path
) -> None:
    """What a replica sees when a stranger holds rank 0 (it took the trainer's place in the open store): the
    stranger sends forged buckets of the right layout, but does not know the push's secret."""
    model = _model(trainer_model_dir, 3.0)
    payload = serialize(dedupe_tied(model, dict(model.state_dict())))
    forged = serialize(dedupe_tied(poison := _model(trainer_model_dir, -2.0), dict(poison.state_dict())))
    start, sizes = bucket_sizes(forged, BUCKET_BYTES)
    assert forged[:start] == payload[:start], "the same layout"
    store = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    spec = inference_pb2.WeightsBroadcast(
        store_host="127.0.0.1", store_port=int(store.port), group="lodestar-weights/v1/0123456789ab/0",
        backend="gloo", rank=1, world_size=2, timeout_s=TIMEOUT_S, total_bytes=len(payload),
        safetensors_header=payload[:start], bucket_bytes=sizes,
    )  # fmt: skip
    if HANDSHAKE:
        spec.secret = secrets.token_bytes(32)  # the trainer's, sent to the replica only

    def forge(group: Any) -> None:
        if HANDSHAKE:  # a nonce, the replica's answer, a guessed proof
            _broadcast(group, torch.frombuffer(bytearray(secrets.token_bytes(32)), dtype=torch.uint8))
            _broadcast(group, torch.zeros(64, dtype=torch.uint8), root=1)
            _broadcast(group, torch.frombuffer(bytearray(secrets.token_bytes(32)), dtype=torch.uint8))
        offset = start
        for size in sizes:
            _broadcast(group, torch.frombuffer(bytearray(forged[offset : offset + size]), dtype=torch.uint8))
            offset += size

    stranger = _Stranger(int(store.port), 0, forge)
    stranger.start()
    path = tmp_path / "received"
    try:
        receive_broadcast(spec, path, max_bytes=1 << 30)
    except UnavailableError as error:
        refused: UnavailableError | None = error
    else:
        refused = None
    stranger.join(30)
    assert refused is not None, "the replica accepted a stranger's weights as the trainer's"
    assert "secret" in refused.message
    del store


@pytest.mark.skipif(not HANDSHAKE, reason="the code under test has no broadcast MAC")
def test_bytes_changed_on_the_way_are_refused(trainer_model_dir: Path, tmp_path: Path) -> None:
    """A rank 0 that passes the handshake (as the trainer would) but whose buckets were changed on the way
    (one byte flipped): the data's MAC, sent after them, does not match, and the replica refuses them."""
    from lodestar import broadcast_auth

    model = _model(trainer_model_dir, 3.0)
    payload = serialize(dedupe_tied(model, dict(model.state_dict())))
    start, sizes = bucket_sizes(payload, BUCKET_BYTES)
    store = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    spec = inference_pb2.WeightsBroadcast(
        store_host="127.0.0.1", store_port=int(store.port), group="lodestar-weights/v1/0123456789ab/0",
        backend="gloo", rank=1, world_size=2, timeout_s=TIMEOUT_S, total_bytes=len(payload),
        safetensors_header=payload[:start], bucket_bytes=sizes, secret=broadcast_auth.new_secret(),
    )  # fmt: skip
    changed = bytearray(payload)
    changed[start + 10] ^= 0xFF

    def tamper(group: Any) -> None:
        ours = broadcast_auth.new_nonce()
        _broadcast(group, torch.frombuffer(bytearray(ours), dtype=torch.uint8))
        answer = torch.zeros(64, dtype=torch.uint8)
        _broadcast(group, answer, root=1)
        theirs = bytes(answer[:32])
        proof = broadcast_auth.proof(spec.secret, "trainer", spec.group, theirs)
        _broadcast(group, torch.frombuffer(bytearray(proof), dtype=torch.uint8))
        mac = broadcast_auth.data_mac(spec.secret, spec.group, (ours, theirs))
        mac.update(payload[start:])  # the trainer's MAC of what it sent
        offset = start
        for size in sizes:
            _broadcast(group, torch.frombuffer(changed[offset : offset + size], dtype=torch.uint8))
            offset += size
        _broadcast(group, torch.frombuffer(bytearray(mac.digest()), dtype=torch.uint8))

    stranger = _Stranger(int(store.port), 0, tamper)
    stranger.start()
    with pytest.raises(UnavailableError, match="MAC"):
        receive_broadcast(spec, tmp_path / "received", max_bytes=1 << 30)
    stranger.join(30)
    assert stranger.error is None, stranger.error
    del store
