"""OpenAI's prediction counts (usage.completion_tokens_details) in near-linear time.

`accepted_prediction_tokens` are the prediction's tokens the completion used, in
order; `rejected_prediction_tokens` the rest (docs/methods.md#predicted-outputs).
They come from one walk over both sequences, the way an editor reads a diff:
follow the prediction while the completion agrees with it; where they differ,
take the nearer of two places where they agree again: the completion's next
ANCHOR tokens later in the prediction (the prediction's tokens between were left
out) or the prediction's next ANCHOR tokens later in the completion (the
completion's tokens between are its own), fewer tokens at either's end. Where
neither appears, the two tokens differ (a changed token) and the walk moves past
both. Each step moves at least one of the two places forward and looks up two runs
in an index (a dict of sorted start lists, built at the first difference), so
a prediction of m tokens against a completion of n costs O((n + m) log(n + m)),
where the longest-match alignment it replaces (difflib's) cost O(n * m) and more,
on the thread that schedules every request. The matched tokens are a common subsequence, so the
count never exceeds the longest one's; for an answer that edits the prediction
in separate places it is that longest one.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from ...metrics import PredictionCounts

ANCHOR = 4  # tokens in a row that must agree for the walk to resume after a difference


class _Starts:
    """Where each run of 1..ANCHOR tokens starts in a sequence, in increasing order (the
    runs of one length indexed when first looked up: shorter ones only near an end)."""

    def __init__(self, seq: Sequence[int]):
        self.seq = seq
        self.at: dict[int, dict[tuple[int, ...], list[int]]] = {}

    def first(self, run: tuple[int, ...], start: int) -> int | None:
        """The first place at or after `start` where `run` starts; None if none."""
        if len(run) not in self.at:
            index: dict[tuple[int, ...], list[int]] = {}
            for s in range(len(self.seq) - len(run) + 1):
                index.setdefault(tuple(self.seq[s:s + len(run)]), []).append(s)
            self.at[len(run)] = index
        places = self.at[len(run)].get(run)
        if places is None:
            return None
        k = bisect_left(places, start)
        return places[k] if k < len(places) else None


def matched_pairs(prediction: Sequence[int], completion: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(prediction index, completion index) of each prediction token the completion
    used, both strictly increasing (the module doc's walk)."""
    m, n = len(prediction), len(completion)
    p = i = 0
    in_prediction = in_completion = None
    while p < m and i < n:
        if prediction[p] == completion[i]:
            yield p, i
            p, i = p + 1, i + 1
            continue
        if in_prediction is None:
            in_prediction, in_completion = _Starts(prediction), _Starts(completion)
        p, i = _agree_again(prediction, completion, p, i, in_prediction, in_completion)


def _agree_again(prediction: Sequence[int], completion: Sequence[int], p: int, i: int,
                 in_prediction: _Starts, in_completion: _Starts) -> tuple[int, int]:
    """The places (p', i') where the walk goes on after prediction[p] != completion[i],
    p' >= p and i' >= i, one of them greater (the module doc)."""
    q = in_prediction.first(tuple(completion[i:i + ANCHOR]), p + 1)
    j = in_completion.first(tuple(prediction[p:p + ANCHOR]), i + 1)
    if q is not None and (j is None or q - p < j - i):
        return q, i
    if j is not None:
        return p, j
    return p + 1, i + 1


def prediction_counts(prediction: Sequence[int], completion: Sequence[int]) -> PredictionCounts:
    """OpenAI's accepted / rejected prediction tokens: the prediction's tokens the
    completion used, in order (`matched_pairs`), and the rest; they add up to its length."""
    accepted = sum(1 for _ in matched_pairs(prediction, completion))
    return PredictionCounts(accepted, len(prediction) - accepted)
