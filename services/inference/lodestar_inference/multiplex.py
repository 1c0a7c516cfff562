"""Many generations over one stream (`GenerateMany`): tagged requests in, batches of tagged results out.

A caller that runs many generations at once (the gateway) pays gRPC's per-call and per-message costs once
per stream and once per batch instead of once per generation and per delta: on a loopback those costs
(HTTP/2 framing, a `sendmsg` and a wake-up of the other side per message) are most of what a streamed token
costs the front-end. `Multiplexer` is the transport-free half: the servicer feeds it `start`/`cancel` from
the request stream and writes each item of `batches()` as one message.

Batching needs no timer. Each tag's generation runs as its own task and appends its responses to one
ready list; `batches()` takes the whole list whenever it is woken. Every stream whose engine step
completed together is woken in the same event-loop pass, and the batch writer runs after them, so one
engine step becomes one message; while a write waits for the client, the next batch simply grows. The
first delta of a generation is never held: it goes out with the batch of the step that made it.

Per tag the semantics are Generate's: its responses in order, ending with the final response or one
error (a `LodestarError`, which the servicer turns into a status code). A cancelled tag sends nothing
more. `drain()` refuses new tags (UNAVAILABLE) and lets `batches()` end once the open ones are done.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from lodestar.errors import DeadlineExceededError, InternalError, InvalidArgumentError, LodestarError, UnavailableError
from lodestar.logging import get_logger
from lodestar.v1 import inference_pb2

_log = get_logger("inference.multiplex")

Outcome = inference_pb2.GenerateResponse | LodestarError
"""A tag's next response, or the error that ends it."""
Generate = Callable[[inference_pb2.GenerateRequest], AsyncIterator[inference_pb2.GenerateResponse]]


class Multiplexer:
    """The open generations of one `GenerateMany` stream (see the module docstring)."""

    def __init__(self, generate: Generate) -> None:
        self._generate = generate
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._ready: list[tuple[int, Outcome]] = []
        self._wake = asyncio.Event()
        self._input_done = False
        self._draining = False

    @property
    def open_tags(self) -> int:
        return len(self._tasks)

    def start(self, tag: int, request: inference_pb2.GenerateRequest, timeout_s: float = 0.0) -> None:
        """Start generation `tag` (`timeout_s` > 0: its deadline)."""
        if self._draining:
            self._put(tag, UnavailableError("the inference server is draining; retry shortly"))
        elif tag in self._tasks:
            self._put(tag, InvalidArgumentError(f"tag {tag} is already open on this stream"))
        elif not timeout_s >= 0.0:
            self._put(tag, InvalidArgumentError(f"timeout_s must be >= 0, got {timeout_s}"))
        else:
            self._tasks[tag] = asyncio.create_task(self._run(tag, request, timeout_s), name=f"generate-many-{tag}")

    def reject(self, tag: int, error: LodestarError) -> None:
        """Answer `tag` with `error` without starting anything (a malformed request)."""
        self._put(tag, error)

    def cancel(self, tag: int) -> None:
        """Stop generation `tag` and free its slot; nothing more is sent for it (no-op when it has ended)."""
        task = self._tasks.pop(tag, None)
        if task is not None:
            task.cancel()
            self._wake.set()

    def end_input(self) -> None:
        """No more requests will come: `batches()` ends once the open tags are done."""
        self._input_done = True
        self._wake.set()

    def drain(self) -> None:
        """Refuse new tags with UNAVAILABLE and end the stream once the open ones are done."""
        self._draining = True
        self.end_input()

    async def batches(self) -> AsyncIterator[list[tuple[int, Outcome]]]:
        """Everything ready since the previous batch, in order per tag; ends after `end_input()` once no
        tag is open and everything has been handed out."""
        while True:
            if self._ready:
                batch, self._ready = self._ready, []
                yield batch
                continue
            if self._input_done and not self._tasks:
                return
            self._wake.clear()
            await self._wake.wait()

    async def aclose(self) -> None:
        """Cancel every open tag (the stream went away) and wait for their engine slots to be freed."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _put(self, tag: int, outcome: Outcome) -> None:
        self._ready.append((tag, outcome))
        self._wake.set()

    async def _run(self, tag: int, request: inference_pb2.GenerateRequest, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s or None):
                async for response in self._generate(request):
                    self._put(tag, response)
        except TimeoutError:
            self._put(tag, DeadlineExceededError(f"the generation ran past its {timeout_s:g} s deadline"))
        except LodestarError as error:
            self._put(tag, error)
        except Exception:  # a bug: the caller gets INTERNAL, the log gets the details
            _log.exception("generation failed", tag=tag, request_id=request.request_id)
            self._put(tag, InternalError("internal error (see server log)"))
        finally:
            if self._tasks.get(tag) is asyncio.current_task():
                del self._tasks[tag]
            self._wake.set()
