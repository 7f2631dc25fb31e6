"""Fresh prompts per phase, and N never above the requests a row has (docs/bench.md#trust).

A server remembers what it is sent: a prompt cache keeps a prompt's KV, speclm's
suffix cache its answer. A prompt sent to it a second time in one run is timed
replaying the first (speclm serve's multi-turn-edit nearly doubled its tok/s
when the concurrency rows resent the latency phase's prompts).

Phases, in run order: the latency passes (one per repeat × T × max_new_tokens,
each sending its prompts once, AR and every method, or A and B, on each), then
the concurrency rows (one per T × concurrency repeat × N).

The rule:
- The in-process bench runs every phase, and every arm within it, in a cache
  scope of its own (`Phase.scope`): the engine has seen none of a phase's
  prompts, so every phase sends the whole prompt set.
- A server the bench cannot make forget (`--endpoint`) gets each prompt once:
  every category's prompts are cut into one contiguous run per phase (a
  sequence such as multi-turn-edit stays in order), phase f taking run f of
  every category, when every category holds at least one prompt per phase.
  Otherwise every phase sends the whole set, and each phase after the first
  is flagged `replay`.
  The endpoint's warm-up sends the first prompt reversed (endpoint/run.py), none
  of the set.
- A concurrency row's N is min(N asked, the prompts it sends); the row records
  both and `InFlight` the peak of requests it had in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ..setup.config import BenchConfig
from ..setup.workloads import Prompt


@dataclass(frozen=True)
class Phase:
    """One pass of a run over its prompts: a latency pass (n_asked None) or a concurrency row."""

    temperature: float
    max_new_tokens: int
    repeat: int
    prompts: tuple[Prompt, ...]
    replay: bool = False  # its server was sent these prompts earlier in the run
    n_asked: int | None = None  # a concurrency row's N as asked (--concurrency)

    @property
    def n(self) -> int | None:
        """The requests a concurrency row keeps in flight: never more than it has."""
        return None if self.n_asked is None else min(self.n_asked, len(self.prompts))

    @property
    def name(self) -> str:
        if self.n_asked is None:
            return f"latency T={self.temperature:g} {self.max_new_tokens} tokens repeat {self.repeat + 1}"
        asked = f" ({self.n_asked} asked)" if self.n != self.n_asked else ""
        return f"concurrency N={self.n}{asked} T={self.temperature:g} repeat {self.repeat + 1}"

    def scope(self, arm: int) -> str:
        """The cache scope arm number `arm` runs this phase in (in process): its own."""
        if self.n_asked is None:
            return f"bench-arm{arm}-T{self.temperature:g}-n{self.max_new_tokens}-r{self.repeat}"
        return f"bench-concurrency-arm{arm}-{self.n_asked}-T{self.temperature:g}-r{self.repeat}"

    def to_dict(self) -> dict:
        return {"phase": self.name, "temperature": self.temperature, "max_new_tokens": self.max_new_tokens,
                "repeat": self.repeat, "concurrency": self.n, "concurrency_requested": self.n_asked,
                "prompts": [[p.category, p.index] for p in self.prompts], "replay": self.replay}


def split(prompts: Sequence[Prompt], parts: int) -> list[tuple[Prompt, ...]] | None:
    """`prompts` (run order) cut into `parts` parts, each category's prompts into contiguous
    runs, part f holding run f of every category; None when a category has fewer prompts
    than parts (some part would lack it)."""
    cats = [[p for p in prompts if p.category == c] for c in dict.fromkeys(p.category for p in prompts)]
    if any(len(ps) < parts for ps in cats):
        return None
    return [tuple(p for ps in cats for p in ps[f * len(ps) // parts:(f + 1) * len(ps) // parts])
            for f in range(parts)]


def plan(prompts: Sequence[Prompt], cfg: BenchConfig, *, forgets: bool) -> tuple[list[Phase], list[Phase]]:
    """(latency passes, concurrency rows) of `cfg` over `prompts` (run order), by the module's
    rule; `forgets`: each phase runs in a cache scope of its own (in process)."""
    passes = [(t, n, rep, None) for rep in range(cfg.repeats) for t in cfg.temperatures for n in cfg.max_new_tokens]
    rows = [(t, cfg.max_new_tokens[0], rep, n) for t in cfg.temperatures for rep in range(cfg.concurrency_repeats)
            for n in cfg.concurrency]
    shapes = passes + rows
    parts = None if forgets else split(prompts, len(shapes))
    phases = [Phase(t, n, rep, parts[i] if parts else tuple(prompts), replay=not forgets and not parts and i > 0,
                    n_asked=asked) for i, (t, n, rep, asked) in enumerate(shapes)]
    return phases[:len(passes)], phases[len(passes):]


def warnings(phases: Sequence[Phase]) -> list[str]:
    """The run's warnings: phases that resend prompts, concurrency rows whose N was capped."""
    out = []
    replays = [p for p in phases if p.replay]
    if replays:
        out.append(f"{len(replays)} of {len(phases)} phases resend prompts their server was sent earlier in this "
                   f"run ({', '.join(p.name for p in replays)}): a server with a prompt or suffix cache is timed "
                   f"replaying its answers; every phase gets prompts of its own with at least {len(phases)} "
                   "prompts per category")
    for asked, n in dict.fromkeys((p.n_asked, p.n) for p in phases if p.n != p.n_asked):
        out.append(f"--concurrency {asked} ran as N = {n}: a row has only {n} prompts, so no more requests "
                   "were in flight")
    return out


class InFlight:
    """Counts a row's requests in flight as its clients send them and get their answers;
    `peak` is the most it had at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.peak = 0

    @contextmanager
    def request(self) -> Iterator[None]:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            with self._lock:
                self.now -= 1
