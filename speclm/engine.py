"""Several requests in flight on one LLM: a scheduler thread runs them in
steps. By default (batched) a step is ONE forward over every active request's
round block or prefill chunk (speclm/speculative/steps.py), or a few smaller forwards where
the target's measured cost curve prices them cheaper (`split_forwards`);
`batched=False` takes turns instead, one request's round at a time (round-robin). Both run requests through the one driver, speculative/steps.py.

    engine = Engine(llm, max_concurrency=8)
    handle = engine.submit("def f():", SamplingParams(max_new_tokens=32), SpecConfig("sd-ngram"))
    for text in handle.stream(): print(text, end="")
    result = handle.result()
    engine.shutdown()

Submitting beyond max_concurrency queues the request (bounded by
max_queue; beyond that `EngineFullError`). Cancelling frees the request's
KV sequence at the scheduler's next turn.

Buffers a step frees are reused by the next (`machine.reuse_freed_buffers`, set
when an Engine is made), and memory freed by finished requests goes back to the
operating system whenever the scheduler falls idle and after every TRIM_EVERY
finished requests (`machine.return_freed_memory`), so a server's resident memory
stays bounded.

The scheduler holds `llm.backend_lock` for each round it runs, so work another
thread does on the same models (the cost-model calibration of a new `auto`
request, `llm.generate`) runs between rounds, never inside one.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator

from .api import LLM, SpecConfig
from .costs import TIMED_K
from .speculative.steps import PREFILL_CHUNK, PREFILL_STEP, plan_step, run_step, step_alone
from .errors import BusyError, InvalidRequestError, SpeclmError
from .machine import return_freed_memory, reuse_freed_buffers
from .metrics import GenerationResult
from .sampling import SamplingParams
from .speculative.loop import Generation  # noqa: F401  (the type the scheduler steps)

TRIM_EVERY = 64  # finished requests between two returns of freed memory under constant load


class EngineFullError(BusyError):
    """Too many requests queued: retry later (HTTP 429)."""


class RequestHandle:
    """A submitted request: stream its text, wait for its result, cancel it.

    Deltas are kept in a list, so any number of readers (threads or asyncio
    tasks) can follow them; asyncio readers are woken through their own event
    loop (no thread is parked per waiting request).
    """

    served_by: str | None = None  # which replica generates it (a Ray deployment's; None in one process)
    echo: str | None = None  # the server's echo: true: the prompt's text, answered before the completion

    def __init__(self, rid: str, prompt_ids: list[int]):
        self.id = rid
        self.prompt_ids = prompt_ids
        self._items: list[str] = []
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._finished = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self.cancelled = False

    # called by the scheduler thread
    def _notify(self) -> None:
        self._cond.notify_all()
        for loop, event in self._waiters:
            loop.call_soon_threadsafe(event.set)

    def _push(self, text: str) -> None:
        with self._cond:
            self._items.append(text)
            self._notify()

    def _finish(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        with self._cond:
            self._result, self._error = result, error
            self._finished.set()
            self._notify()

    # called by clients
    def cancel(self) -> None:
        self.cancelled = True

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> GenerationResult:
        if not self._finished.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def stream(self) -> Iterator[str]:
        """Text deltas as they become final; ends when the request does."""
        seen = 0
        while True:
            with self._cond:
                while seen == len(self._items) and not self.done:
                    self._cond.wait()
                new, finished = self._items[seen:], self.done
            seen += len(new)
            yield from new
            if finished:
                break
        if self._error is not None:
            raise self._error

    async def astream(self) -> AsyncIterator[str]:
        """`stream()` for asyncio code."""
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._cond:
            self._waiters.append(waiter)
        try:
            seen = 0
            while True:
                event.clear()
                with self._cond:
                    new, finished = self._items[seen:], self.done
                seen += len(new)
                for item in new:
                    yield item
                if finished:
                    break
                await event.wait()
        finally:
            with self._cond:
                self._waiters.remove(waiter)
        if self._error is not None:
            raise self._error

    async def aresult(self) -> GenerationResult:
        """`result()` for asyncio code."""
        async for _ in self.astream():
            pass
        return self.result(0)


class Engine:
    """Scheduler over Generations sharing one LLM: one forward per step for all
    (batched), or one request's round per turn (batched=False)."""

    def __init__(self, llm: LLM, max_concurrency: int = 4, max_queue: int = 64, start: bool = True,
                 batched: bool = True, prefill_chunk: int = PREFILL_CHUNK, split_forwards: bool = True,
                 prefill_step: int = PREFILL_STEP):
        capacity = llm.target.max_sequences
        if capacity is not None and max_concurrency > capacity:
            raise InvalidRequestError(
                f"max_concurrency {max_concurrency} exceeds the {capacity} KV sequences the model was "
                f"loaded with: load it with LLM(max_sequences={max_concurrency}) or lower the concurrency")
        self.llm = llm
        self.batched, self.prefill_chunk, self.prefill_step = batched, prefill_chunk, prefill_step
        # the target's v(rows), calibrated once per LLM (no request learns it): a step whose
        # one forward is priced dearer than a few smaller ones runs as those (steps.forwards)
        self.forward_costs = llm.cost_model(None, TIMED_K) if batched and split_forwards and max_concurrency > 1 \
            else None
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self._pending: deque[tuple[RequestHandle, Generation]] = deque()
        self._active: list[tuple[RequestHandle, Generation]] = []
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._stop = False
        self._untrimmed = 0  # requests finished since freed memory was last returned
        reuse_freed_buffers()
        self._thread = threading.Thread(target=self._run, name="speclm-engine", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Start the scheduler thread (done by the constructor unless start=False)."""
        self._thread.start()

    def submit(self, prompt: str | list[int], params: SamplingParams | None = None,
               spec: SpecConfig | None = None, chat: bool = False,
               prediction: str | list[int] | None = None) -> RequestHandle:
        """Validate and enqueue a request; errors in the request raise here.
        prediction: the output expected, a draft source (LLM.start)."""
        params = params or SamplingParams()
        spec = spec or SpecConfig()  # the same default as LLM.generate: auto
        prompt_ids = self.llm.encode(prompt, chat)
        handle = RequestHandle(f"req-{next(self._ids)}", prompt_ids)
        gen = self.llm.start(prompt_ids, params, spec, on_text=handle._push, prediction=prediction)
        with self._lock:
            if self._stop:
                gen.close()
                raise SpeclmError("the engine is shutting down")
            free_slots = max(0, self.max_concurrency - len(self._active))
            if len(self._pending) - free_slots >= self.max_queue:
                gen.close()
                raise EngineFullError(f"{len(self._active)} requests running and {len(self._pending)} "
                                      f"queued (limit {self.max_queue}): retry later")
            self._pending.append((handle, gen))
            self._lock.notify()
        return handle

    @property
    def alive(self) -> bool:
        """Whether the scheduler thread runs and takes requests."""
        return self._thread.is_alive() and not self._stop

    @property
    def load(self) -> tuple[int, int]:
        """(running, queued) request counts."""
        with self._lock:
            return len(self._active), len(self._pending)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not self._active and not self._pending:
                    if self._untrimmed:  # idle: what the finished requests freed goes back now
                        self._return_memory()
                    self._lock.wait()
                if self._stop and not self._active and not self._pending:
                    return
                dropped = [e for e in self._pending if e[0].cancelled]  # never admitted
                for entry in dropped:
                    self._pending.remove(entry)
                while self._pending and len(self._active) < self.max_concurrency:
                    self._active.append(self._pending.popleft())
                batch = list(self._active)
            for handle, gen in dropped:
                with self.llm.backend_lock:
                    gen.close()
                handle._finish(gen.result())
            if self.batched:
                self._step_together(batch)
            else:
                self._step_in_turns(batch)
            if self._untrimmed >= TRIM_EVERY:
                self._return_memory()

    def _return_memory(self) -> None:
        return_freed_memory()
        self._untrimmed = 0

    def _retire(self, handle: RequestHandle, gen: Generation, error: BaseException | None = None) -> None:
        if error is not None:
            with self.llm.backend_lock:
                gen.close()
        handle._finish(None if error is not None else gen.result(), error)
        with self._lock:
            self._active.remove((handle, gen))
        self._untrimmed += 1

    def _step_together(self, batch: list[tuple[RequestHandle, Generation]]) -> None:
        """One forward for every active request (cancelled ones are freed first)."""
        live = []
        for handle, gen in batch:
            if handle.cancelled:
                with self.llm.backend_lock:
                    gen.close()
                self._retire(handle, gen)
            else:
                live.append((handle, gen))
        owner = {id(gen): handle for handle, gen in live}
        with self.llm.backend_lock:
            slots = plan_step([gen for _, gen in live], self.llm.target.n_ctx, self.prefill_chunk,
                              split=self.forward_costs is not None, costs=self.forward_costs,
                              prefill_step=self.prefill_step)
            run_step(self.llm.target, slots, self.forward_costs)
        for s in slots:
            if s.error is not None or s.finished:
                self._retire(owner[id(s.gen)], s.gen, s.error)

    def _step_in_turns(self, batch: list[tuple[RequestHandle, Generation]]) -> None:
        """One round of each request in turn (the unbatched scheduler)."""
        for handle, gen in batch:
            finished = True
            try:
                with self.llm.backend_lock:
                    if handle.cancelled:
                        gen.close()
                    elif not step_alone(gen):
                        finished = False
            except BaseException as exc:  # a failed request must not stop the others
                self._retire(handle, gen, exc)
                continue
            if finished:
                self._retire(handle, gen)

    def shutdown(self, cancel: bool = False, timeout: float | None = 30.0) -> None:
        """Stop accepting requests; finish (or cancel) those in flight; join."""
        with self._lock:
            self._stop = True
            if cancel:
                for handle, _ in [*self._active, *self._pending]:
                    handle.cancel()
            self._lock.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
