"""Stage 1 under a grammar: a draft clipped to what the grammar allows, with the runs it forces.

A constrained request's draft is shaped after the proposer drafts it
(docs/design.md#structured-outputs): clipped at its first token the grammar
forbids (that token can never be accepted), its tokens that fall on a run the
grammar forces marked certain, the forced run after it appended as
deterministic draft tokens (they cost only their rows in the verify forward),
and, where the proposer can continue after a forced run, its continuation
appended the same way. The grammar's state is rolled back afterwards: only
emitted tokens enter it (`GrammarMask.advance`).

Lossless: clipping drops only tokens the masked p gives 0, which is lossless
for a deterministic draft token (its residual is p itself) and for greedy or
seeded requests; a token drawn from a q by an unseeded sampled request keeps
its forbidden token in the block, so it is rejected and the next token drawn
from the residual max(0, p - q) as usual.
"""

from __future__ import annotations

from collections.abc import Callable

from ..constraints import GrammarMask
from ..sampling import SamplingParams
from .proposers.base import Draft

SOURCE = "grammar"  # the source of tokens the grammar forced (controller.draft_groups reads it)


def shape_draft(mask: GrammarMask, draft: Draft, room: int, params: SamplingParams,
                extend: Callable[[list[int], int], Draft] | None = None) -> list[int]:
    """Shape draft in place under mask's grammar, to at most `room` tokens: clip it at its
    first forbidden token; mark its tokens on a forced run certain; append the run the
    grammar forces after it; with extend(drafted, n) (the proposer's continuation of up to
    n tokens, proposers.base.Proposer.extend) go on drafting after each forced run, clipped
    the same way. Returns the positions of the forced tokens in the draft."""
    n = mask.valid_prefix(draft.tokens)
    if n < len(draft):
        drawn = draft.q[n] is not None and not params.greedy and params.seed is None
        draft.truncate(n + 1 if drawn else n)
        if drawn:  # its rejection draws from the residual of its q (module docstring)
            return []
    estimates = draft.confidence is not None or not draft.tokens  # a controller can price the block
    forced_at: list[int] = []
    pos = 0  # tokens of the draft the grammar's state has consumed
    try:
        while (pos < len(draft) or len(draft) < room) and not mask.stopped():
            forced = mask.forced()
            if pos < len(draft):  # inside the draft: the tokens it shares with the forced run are forced
                run = _common_prefix(forced, draft.tokens[pos:])
                draft.mark_certain(range(pos, pos + run), SOURCE, estimates)
                forced_at += range(pos, pos + run)
                step = max(run, 1)
                mask.consume(draft.tokens[pos:pos + step])
                pos += step
                continue
            forced = forced[:room - len(draft)]
            if not forced:
                break
            forced_at += range(pos, pos + len(forced))
            draft.append(forced, [1.0] * len(forced) if estimates else None, (SOURCE, None), [0] * len(forced))
            mask.consume(forced)
            pos = len(draft)
            if extend is not None and estimates and len(draft) < room:
                _extend(mask, draft, extend(list(draft.tokens), room - len(draft)))
    finally:
        mask.rollback(pos)
    if forced_at[:1] == [0] and estimates:  # a block that starts certain is no bet of the proposer's
        draft.source = SOURCE
    return forced_at


def _extend(mask: GrammarMask, draft: Draft, more: Draft) -> None:
    """Append the prefix of the proposer's continuation `more` the grammar allows."""
    kept = mask.valid_prefix(more.tokens)
    if kept:
        draft.append(more.tokens[:kept], more.confidence[:kept], (more.source, more.match_len),
                     list(more.support or [0] * kept)[:kept], more.origins)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n
