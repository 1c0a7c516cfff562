"""The inference service's domain object: engine, tokenizer, chat template and policy versions, together.

`InferenceService` answers the four RPCs with protobuf messages in and out (no grpc import): Generate via
`Generation` (refused, UNAVAILABLE, when the engine serves a version older than the call's
`min_policy_version`: a replica restarted at its starting weights, not yet brought up by a push),
CountTokens via the chat template, UpdateWeights (one at a time: read the update within its limits (a
checkpoint_path under --checkpoint-dirs, a stream of at most --max-weights-bytes), validate its tensors
against the engine, swap, publish the version and record its writer), and GetModelInfo (which reports the
served version's writer: `policy_writer`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from google.protobuf import timestamp_pb2

from lodestar.errors import InvalidArgumentError, UnavailableError
from lodestar.logging import get_logger
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_inference import engines
from lodestar_inference.engine import Engine, WeightUpdate
from lodestar_inference.generation import Generation
from lodestar_inference.settings import InferenceSettings
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.tokenizer import TextTokenizer
from lodestar_inference.toolcalls import format_for
from lodestar_inference.weights import (
    UpdateLimits,
    check_base,
    check_newer,
    default_spool_dir,
    read_checkpoint_meta,
    receive_update,
    upload_limit,
)

_log = get_logger("inference")


class InferenceService:
    """See the module docstring."""

    def __init__(self, settings: InferenceSettings, engine: Engine, template: ChatTemplate) -> None:
        self._settings = settings
        self._engine = engine
        self.template = template
        self.tool_format = format_for(settings.tool_call_format, template.tokenizer.chat_template)
        self._generation = Generation(
            engine,
            template,
            self.tool_format,
            max_new_tokens=settings.max_new_tokens,
            flush_s=settings.stream_flush_ms / 1e3,
            messages_per_s=settings.stream_messages_per_s,
        )
        self._update_lock = asyncio.Lock()
        self._spool_lock = asyncio.Lock()
        self._limits = UpdateLimits(
            checkpoint_dirs=tuple(settings.checkpoint_dirs),
            max_bytes=upload_limit(settings.model, settings.max_weights_bytes),
        )
        self._published_at = timestamp_pb2.Timestamp()
        self._writer = ""
        """The writer of the served version (UpdateWeights' `writer`); empty: the weights loaded at start."""
        self._ready = False
        self.on_published: list[Callable[[int], None]] = []
        """Called with each policy version once it serves it (the etcd registration rewrites its record)."""

    @property
    def replica_id(self) -> str:
        """This replica's name in every final (`GenerateFinal.served_by`)."""
        return self._generation.replica_id

    @replica_id.setter
    def replica_id(self, value: str) -> None:
        self._generation.replica_id = value

    @property
    def policy_version(self) -> int:
        """The policy version served now."""
        return self._engine.policy_version

    @classmethod
    def create(cls, settings: InferenceSettings) -> InferenceService:
        """Build (not start) the service for `settings` (the model directory is required)."""
        if settings.model is None:
            raise InvalidArgumentError("the inference service needs --model DIR (see `lodestar model init-tiny`)")
        template = ChatTemplate(TextTokenizer.load(settings.model))
        return cls(settings, engines.create(settings), template)

    @property
    def model_name(self) -> str:
        if self._settings.model_name:
            return self._settings.model_name
        return self._settings.model.name if self._settings.model is not None else "model"

    async def start(self) -> None:
        await self._engine.start()
        self._published_at.GetCurrentTime()
        self._ready = True

    async def close(self) -> None:
        self._ready = False
        await self._engine.close()

    def _check_ready(self) -> None:
        if not self._ready:
            raise UnavailableError("the inference engine is starting")

    def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        self._check_ready()
        if (served := self._engine.policy_version) < request.min_policy_version:
            _log.info(
                "refused a call that needs a newer policy version",
                policy_version=served,
                min_policy_version=request.min_policy_version,
                session_id=request.session_id,
            )
            raise UnavailableError(
                f"this replica serves policy version {served}, the call needs {request.min_policy_version} or "
                "newer (a replica that restarted serves its starting weights until the trainer's next push)"
            )
        return self._generation.run(request)

    async def count_tokens(self, request: inference_pb2.CountTokensRequest) -> inference_pb2.CountTokensResponse:
        count = await asyncio.to_thread(self.template.count_tokens, request.messages, request.tools)
        return inference_pb2.CountTokensResponse(prompt_tokens=count)

    async def update_weights(
        self, requests: AsyncIterator[inference_pb2.UpdateWeightsRequest]
    ) -> inference_pb2.UpdateWeightsResponse:
        self._check_ready()
        spool = self._settings.weights_spool_dir or default_spool_dir()
        async with self._spool_lock:  # one update spools at a time: at most max_bytes of the spool dir
            path, requested, spooled, base, writer = await receive_update(
                requests, spool, self._limits, lambda base: check_base(base, self._engine.policy_version)
            )
        try:
            async with self._update_lock:
                started = time.perf_counter()
                check_base(base, self._engine.policy_version)  # a swap may have landed while this one spooled
                files, tensors = read_checkpoint_meta(path, None if spooled else self._limits.checkpoint_dirs)
                self._engine.validate_weights(tensors)
                current = self._engine.policy_version
                version = requested or current + 1
                check_newer(version, current, writer, self._writer)
                update = WeightUpdate(path=path, tensors=tuple(tensors), version=version, files=tuple(files))
                served = await self._engine.update_weights(update)
                self._published_at.GetCurrentTime()
                self._writer = writer
                seconds = time.perf_counter() - started
        finally:
            if spooled:
                await asyncio.to_thread(path.unlink, missing_ok=True)
        _log.info(
            "policy version published",
            policy_version=served,
            tensors=len(tensors),
            base_version=base,
            writer=writer,
            swap_seconds=seconds,
        )
        for listener in self.on_published:
            listener(served)
        return inference_pb2.UpdateWeightsResponse(
            policy_version=served, tensors_updated=len(tensors), swap_seconds=seconds
        )

    def model_info(self) -> inference_pb2.GetModelInfoResponse:
        self._check_ready()
        info = self._engine.info()
        return inference_pb2.GetModelInfoResponse(
            model_name=self.model_name,
            backend=info.backend,
            context_length=info.context_length,
            max_new_tokens=self._settings.max_new_tokens,
            vocab_size=info.vocab_size,
            policy_version=common_pb2.PolicyVersion(
                version=self._engine.policy_version, published_at=self._published_at
            ),
            tool_call_format=self.tool_format.name,
            eos_token_ids=info.eos_token_ids,
            serving_dtype=info.dtype,
            policy_writer=self._writer,
        )
