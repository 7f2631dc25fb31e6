"""Predicted Outputs' usage counts: the prediction's tokens the completion used, in order
(accepted), and the rest (rejected), in time near-linear in the two lengths, so a long
prediction cannot hold up the scheduler thread (speclm/speculative/proposers/prediction_counts.py)."""

from __future__ import annotations

import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from speclm.speculative.proposers.prediction_counts import matched_pairs, prediction_counts


def longest_common(a: list[int], b: list[int]) -> int:
    """The longest common subsequence's length (the quadratic reference, small inputs only)."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b):
            prev, row[j + 1] = row[j + 1], prev + 1 if x == y else max(row[j + 1], row[j])
    return row[-1]


def test_a_changed_token_is_rejected_and_an_added_one_costs_nothing():
    counts = prediction_counts([1, 2, 3, 4, 5, 6], [1, 2, 9, 4, 5, 6, 7])
    assert (counts.accepted, counts.rejected) == (5, 1)


def test_an_answer_equal_to_the_prediction_accepts_all_of_it():
    tokens = list(range(100, 400))
    assert prediction_counts(tokens, tokens).rejected == 0


def test_an_answer_cut_short_rejects_the_prediction_it_never_reached():
    tokens = list(range(100, 400))
    counts = prediction_counts(tokens, tokens[:50])
    assert (counts.accepted, counts.rejected) == (50, 250)


def test_nothing_in_common_rejects_everything():
    counts = prediction_counts([1, 2, 3], [4, 5, 6, 7])
    assert (counts.accepted, counts.rejected) == (0, 3)
    assert prediction_counts([], [1, 2]).accepted == prediction_counts([1, 2], []).accepted == 0


def edited(prediction: list[int], rng: random.Random, edits: int = 6) -> list[int]:
    """The prediction with a preamble and `edits` separate edits (lines inserted, deleted or
    changed), as an editor's answer."""
    out, at = [9001, 9002, 9003], 0
    places = sorted(rng.sample(range(10, len(prediction) - 10, 20), edits))
    for place in places:
        out += prediction[at:place]
        kind, size = rng.choice(["insert", "delete", "change"]), rng.randint(1, 8)
        fresh = [rng.randint(2000, 2999) for _ in range(size)]
        at = place + (0 if kind == "insert" else size)
        out += [] if kind == "delete" else fresh
    return out + prediction[at:]


def test_separate_edits_count_as_the_longest_common_subsequence():
    rng = random.Random(57)
    for _ in range(20):
        prediction = [rng.randint(0, 999) for _ in range(300)]
        answer = edited(prediction, rng)
        assert prediction_counts(prediction, answer).accepted == longest_common(prediction, answer)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=40), st.lists(st.integers(0, 5), max_size=40))
def test_the_accepted_tokens_are_a_common_subsequence(prediction, completion):
    pairs = list(matched_pairs(prediction, completion))
    assert all(prediction[p] == completion[i] for p, i in pairs)
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(pairs, pairs[1:]))
    counts = prediction_counts(prediction, completion)
    assert counts.accepted == len(pairs) <= longest_common(prediction, completion)
    assert counts.accepted + counts.rejected == len(prediction)


def test_a_long_prediction_costs_milliseconds_not_seconds():
    """The issue's case (4000 prediction tokens against 400 answer tokens cost 18.5 s of CPU
    with difflib) and a context-sized worst case: two 32768-token sequences over a
    three-token vocabulary, every token repeated thousands of times. Generous bounds:
    the machine is shared."""
    rng = random.Random(1)
    prediction = [rng.randint(0, 49151) for _ in range(4000)]
    answer = [rng.randint(0, 49151) for _ in range(400)]
    t0 = time.process_time()
    prediction_counts(prediction, answer)
    assert time.process_time() - t0 < 0.5
    a, b = ([rng.randint(0, 2) for _ in range(32768)] for _ in range(2))
    t0 = time.process_time()
    prediction_counts(a, b)
    assert time.process_time() - t0 < 5.0
