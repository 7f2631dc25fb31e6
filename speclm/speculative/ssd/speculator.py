"""The SSD speculator: one draft model pre-drafting the next block for the
likely verification outcomes while the target verifies the current one.

Transport-agnostic: `SpeculatorSession` is driven by three calls,
- `start()` / `sync(context)`: draft a block synchronously (always a miss),
- `resolve(k, t)`: the verifier's outcome → the next block (cache hit or
  fallback), and
- `work()`: one unit of pre-drafting (glue, plan, or one batched draft step
  over every branch); returns False when the cache is complete.
The worker process (worker.py) calls `work()` between messages; tests call it
in-process to force hits (run to completion) or misses (never run).

Invariants: `ctx` is the verified context (every token, the last included);
`block` continues it; `logits[j]` are the draft's logits after
ctx + block[:j]. Every drafted token is drawn from exactly the q sent with it.
No sequence ever holds more than the backend's n_ctx tokens: blocks shrink
(to empty) near the context end and no branch is planned past it. One
session never takes more than its share of the backend's KV sequences
(max_sequences / sessions, its main sequence included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...backends.base import Backend
from ...costs import clock_ms, ewma
from ...sampling import SamplingParams, draw, softmax, target_probs
from ..proposers.draft_model import common_prefix_len, confidence_stop
from ..proposers.ngram import find_continuation
from .fanout import AcceptanceEstimate, allocate_fanout, candidates, outcome_probs, saguaro
from .options import FALLBACKS, SSDOptions  # noqa: F401  (re-exported)

@dataclass
class Block:
    """A drafted block as sent to the verifier."""

    tokens: list[int]
    q: list[np.ndarray | None]
    hit: bool
    info: dict = field(default_factory=dict)


@dataclass
class _Branch:
    """A pre-drafted continuation for outcome (k, t): its KV sequence holds
    ctx + block[:k] + [t] + tokens[:-1] (+ tokens[-1] once a confidence stop ended it)."""

    k: int
    t: int
    seq: int
    prior: float  # the outcome's estimated probability: branches are drafted in this order
    want: int  # tokens to draft: K, or fewer where the context ends or a confidence stop cut it
    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray | None] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)


class SpeculatorSession:
    """One request's speculation state on the speculator's draft backend."""

    def __init__(self, backend: Backend, context: list[int], params: SamplingParams,
                 opts: SSDOptions, k: int, seed: int | None = None, live_sessions=lambda: 1,
                 sessions: int = 1, p_min: float = 0.0):
        """sessions: how many sessions the backend's sequences are shared by (the
        verifier's concurrency); live_sessions(): how many are open now; p_min: every
        neural block and pre-drafted branch stops where the draft's top-1 probability
        falls below it, as DraftModelProposer's drafts do (SpecConfig.p_min)."""
        self.backend, self.params, self.opts, self.k, self.p_min = backend, params, opts, k, p_min
        self.sessions = sessions
        self.rng = np.random.default_rng(None if seed is None else [seed, 0x55D])
        self.live_sessions = live_sessions
        self.ctx: list[int] = list(context)
        self.block: list[int] = []
        self.block_q: list[np.ndarray | None] = []
        self.logits: list[np.ndarray] = []
        self.block_from_hit = False
        self.alpha = AcceptanceEstimate(opts.alpha_prior)
        self.main = backend.new_sequence()
        self.branches: dict[tuple[int, int], _Branch] = {}
        self.stage = "idle"  # idle → glue → plan → draft → done
        self.depth = 0  # draft forwards run for the current branches
        self.busy_ms = 0.0
        self.t_work_done: float | None = None
        self.t_reply: float | None = None  # when the current block was handed over
        self.cycle_ms: float | None = None  # EWMA: block handed over -> its outcome arrives
        self.step_ms: float | None = None  # EWMA: one draft forward
        self.deadline = True  # False: pre-draft every branch whatever the timing (in-process tests)

    # ---- the verifier's calls --------------------------------------------
    def start(self) -> Block:
        return self._handed(self._fallback(self.ctx, neural=True))

    def sync(self, context: list[int]) -> Block:
        """Resynchronise to an arbitrary context (the verifier skipped a block)."""
        self._drop_branches()
        return self._handed(self._fallback(list(context), neural=True))

    def resolve(self, k: int, t: int) -> Block:
        """Outcome of verifying the current block → the next block."""
        if not 0 <= k <= len(self.block):
            return self.sync(self.ctx + self.block[:k] + [t])  # a malformed outcome: be safe
        self.alpha.observe(self.block_from_hit, k, len(self.block))
        if self.t_reply is not None:
            c = clock_ms() - self.t_reply
            self.cycle_ms = ewma(self.cycle_ms, c)
        idle_ms = clock_ms() - self.t_work_done if self.t_work_done else 0.0
        info = {"outcome_k": k, "fanout": len(self.branches), "forwards": self.depth,
                "busy_ms": self.busy_ms, "idle_ms": idle_ms}
        new_ctx = self.ctx + self.block[:k] + [t]
        branch = self.branches.pop((k, t), None)
        if branch is not None and branch.tokens:
            self._drop_branches()
            self.backend.free(self.main)
            self.main = branch.seq
            self._set(new_ctx, branch.tokens, branch.q, branch.logits, hit=True)
            block = Block(list(branch.tokens), list(branch.q), True, info)
        else:
            if branch is not None:
                self.backend.free(branch.seq)
            self._drop_branches()
            block = self._fallback(new_ctx)
            block.info.update(info)
        return self._handed(block)

    def _handed(self, block: Block) -> Block:
        self.t_reply = clock_ms()
        return block

    def close(self) -> None:
        self._drop_branches()
        if self.main is not None:
            self.backend.free(self.main)
            self.main = None

    # ---- pre-drafting ----------------------------------------------------------
    def work(self) -> bool:
        """One unit of pre-drafting; False once there is nothing left to do."""
        if self.stage in ("idle", "done"):
            return False
        t0 = clock_ms()
        if self.stage == "glue":
            self._glue()
            self.stage = "plan"
        elif self.stage == "plan":
            self._plan()
            self.stage = "draft" if self.branches else "done"
        elif self._out_of_time() or not self._draft_step():
            self.stage = "done"
        else:
            ms = clock_ms() - t0
            self.step_ms = ewma(self.step_ms, ms)
        t1 = clock_ms()
        self.busy_ms += t1 - t0
        if self.stage == "done":
            self.t_work_done = t1
        return self.stage != "done"

    def _out_of_time(self) -> bool:
        """True once the most likely branch is complete and another draft forward
        would likely still be running when the outcome arrives (the verifier
        would wait for it): the cache stops growing there."""
        if not self.deadline or self.cycle_ms is None or self.step_ms is None or self.t_reply is None:
            return False
        if not any(len(b.tokens) >= b.want for b in self.branches.values()):
            return False
        return clock_ms() - self.t_reply + self.step_ms > self.cycle_ms

    def _glue(self) -> None:
        """Feed the block's unfed tail so logits are known after every block prefix."""
        want = self.ctx + self.block
        keep = min(common_prefix_len(self.backend.tokens(self.main), want), len(want) - 1)
        self.backend.rollback(self.main, keep)
        rows = self.backend.score(self.main, want[keep:])
        self.logits += [None] * (len(self.block) + 1 - len(self.logits))
        for i, row in enumerate(rows):
            j = keep + i + 1 - len(self.ctx)  # row i is the logits after ctx + block[:j]
            if j >= 0:
                self.logits[j] = row

    def _room(self, ctx_len: int) -> int:
        """Tokens a block may have after a context of ctx_len tokens (<= 0: none)."""
        return min(self.k, self.backend.n_ctx - ctx_len)

    def _branch_budget(self) -> int:
        """Branches this session may fork now: its fan-out, within its share of the
        backend's sequences, leaving a main sequence for every session yet to start."""
        cap = self.backend.max_sequences
        if cap is None:
            return self.opts.fanout
        live = self.live_sessions()
        sessions = max(self.sessions, live, 1)
        free = cap - getattr(self.backend, "live_sequences", 0)
        share = cap // sessions - 1  # our main sequence is part of our share
        return max(0, min(self.opts.fanout, share, free - max(0, sessions - live)))

    def _plan(self) -> None:
        """Fork one branch per likely outcome (k, t*), F_k of them at position k,
        for the outcomes that leave room for a block."""
        kb = len(self.block)
        base = len(self.ctx)
        caps = [self.backend.vocab_size - (1 if k < kb else 0) if self._room(base + k + 1) > 0 else 0
                for k in range(kb + 1)]
        budget = self._branch_budget()
        alpha = self.alpha.alpha(self.block_from_hit)
        fan = allocate_fanout(alpha, kb, budget, self.opts.r, caps)
        p_k = outcome_probs(alpha, kb)
        for k, f in enumerate(fan):
            exclude = self.block[k] if k < kb else None
            q = softmax(self.logits[k])
            rest = 1.0 - (q[exclude] if exclude is not None else 0.0)
            for t in candidates(self.logits[k], f, exclude):
                seq = self.backend.fork(self.main)
                self.backend.rollback(seq, base + k)
                self.branches[(k, t)] = _Branch(k, t, seq, p_k[k] * q[t] / max(rest, 1e-12),
                                                want=self._room(base + k + 1))

    def _draft_step(self) -> bool:
        """One draft forward for the `width` most likely unfinished branches (one
        batch); False when every branch holds its K tokens (fewer at the context end
        or after a confidence stop)."""
        todo = sorted((b for b in self.branches.values() if len(b.tokens) < b.want),
                      key=lambda b: -b.prior)[:max(1, self.opts.width)]
        if not todo:
            return False
        rows = self.backend.score_batch([(b.seq, [b.tokens[-1] if b.tokens else b.t]) for b in todo])
        for b, row in zip(todo, rows):
            if confidence_stop(row[-1], self.p_min, len(b.tokens)):
                b.want = len(b.tokens)
                continue
            tok, q = self._draw(row[-1], len(self.ctx) + b.k + 1 + len(b.tokens))
            b.tokens.append(tok)
            b.q.append(q)
            b.logits.append(row[-1])
        self.depth += 1
        return True

    # ---- helpers -----------------------------------------------------------------
    def _draw(self, logits: np.ndarray, position: int) -> tuple[int, np.ndarray | None]:
        """A draft token for context position `position` and the exact q it was drawn
        from (None: greedy, one-hot); a seeded request's with that position's keyed noise."""
        if self.params.greedy:
            return int(np.argmax(logits)), None
        q = saguaro(target_probs(logits, self.params), self.opts.saguaro_c, self.opts.saguaro_top)
        return draw(q, self.params, self.rng, position), q

    def _fallback(self, new_ctx: list[int], neural: bool | None = None) -> Block:
        """A block drafted now, from new_ctx (a cache miss)."""
        if neural is None:
            mode = self.opts.fallback
            if mode == "auto":
                mode = "neural" if self.live_sessions() < self.opts.cheap_at_sessions else "cheap"
            neural = mode == "neural"
        keep = min(common_prefix_len(self.backend.tokens(self.main), new_ctx), len(new_ctx) - 1)
        self.backend.rollback(self.main, keep)
        n = self._room(len(new_ctx))
        if n <= 0:  # the context is full: nothing to draft, nothing to pre-draft
            self._set(new_ctx, [], [], [], hit=False)
            self.stage = "done"
            return Block([], [], False, {"context_end": True})
        if not neural:
            tokens = find_continuation(new_ctx, n, 2, 4)[:n]
            self._set(new_ctx, tokens, [None] * len(tokens), [], hit=False)
            return Block(tokens, [None] * len(tokens), False, {"fallback": "cheap"})
        logits = self.backend.prefill(self.main, new_ctx[keep:])
        tokens, qs, rows = [], [], []
        for i in range(n):
            if confidence_stop(logits, self.p_min, i):
                break
            tok, q = self._draw(logits, len(new_ctx) + i)
            tokens.append(tok)
            qs.append(q)
            rows.append(logits)
            if i + 1 < n:
                logits = self.backend.prefill(self.main, [tok])
        self._set(new_ctx, tokens, qs, rows, hit=False)
        return Block(tokens, qs, False, {"fallback": "neural"})

    def _set(self, ctx: list[int], tokens: list[int], qs: list, logits: list, hit: bool) -> None:
        self.ctx, self.block, self.block_q = ctx, list(tokens), list(qs)
        self.logits = list(logits)
        self.block_from_hit = hit
        self.stage = "glue"
        self.busy_ms, self.t_work_done, self.depth = 0.0, None, 0

    def _drop_branches(self) -> None:
        for b in self.branches.values():
            self.backend.free(b.seq)
        self.branches.clear()
