"""Stops: max_new_tokens, EOS, stop strings. Nothing after a stop is emitted,
even when a speculative round accepted tokens past it."""

from __future__ import annotations

import pytest

from speclm.backends.toy import ToyBackend
from speclm.sampling import SamplingParams
from speclm.speculative import steps
from speclm.speculative.proposers.ngram import NgramProposer
from speclm.stops import StopChecker


def _plain_text(target, prompt, n):
    return steps.generate(target, None, prompt, SamplingParams(max_new_tokens=n), 0)


@pytest.mark.parametrize("k", [0, 3, 8])
def test_max_new_tokens_is_exact_even_mid_round(k):
    target = ToyBackend(6, seed=5)
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]
    for n in (1, 2, 5, 13):
        res = steps.generate(target, NgramProposer(1, 3), prompt, SamplingParams(max_new_tokens=n), k)
        assert len(res.token_ids) == n and res.finish_reason == "length"
        assert res.token_ids == _plain_text(target, prompt, n).token_ids


@pytest.mark.parametrize("k", [0, 4])
def test_stop_string_cuts_text_and_nothing_after_it_is_emitted(k):
    target = ToyBackend(6, seed=5)
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]
    full = _plain_text(target, prompt, 30).text
    stop = full[7:9]
    first = full.find(stop)
    streamed: list[str] = []
    res = steps.generate(target, NgramProposer(1, 3), prompt,
                        SamplingParams(max_new_tokens=30, stop=(stop,)), k, on_text=streamed.append)
    assert res.finish_reason == "stop"
    assert res.text == full[:first]
    assert "".join(streamed) == res.text
    assert len(res.token_ids) == first + len(stop)  # the token that completed the stop, none after


@pytest.mark.parametrize("stop", [("b", "ab"), ("ab", "b")])
def test_the_earliest_stop_match_wins_whatever_the_list_order(stop):
    """With several stop strings the text is cut where the earliest match
    starts, not at the first string in list order: "cab" with stop b / ab
    gives "c", and the released stream agrees with the final text."""
    checker = StopChecker(ToyBackend(6), SamplingParams(stop=stop))
    released = "".join(checker.push(tok) for tok in (2, 0, 1))  # "c", "a", "b"
    assert checker.finished == "stop"
    assert checker.text == released == "c"


def test_earliest_stop_match_through_the_loop():
    """The same rule in a speculative generation: two stop strings complete on
    the same token, the one listed first starts later; the cut is at the
    start of the other (the earlier match)."""
    target = ToyBackend(6, seed=3)  # greedy text "caffeeaabc…"
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]
    full = _plain_text(target, prompt, 30).text
    # j: full[j:j+2] and full[j-1:j+2] both first occur here, so both complete at j+1
    j = next(j for j in range(3, 27) if full.find(full[j:j + 2]) == j and full.find(full[j - 1:j + 2]) == j - 1)
    later, earlier = full[j:j + 2], full[j - 1:j + 2]
    res = steps.generate(target, NgramProposer(1, 3), prompt,
                        SamplingParams(max_new_tokens=30, stop=(later, earlier)), 4)
    assert res.finish_reason == "stop" and res.text == full[:j - 1]


@pytest.mark.parametrize("seed", [16, 19])  # seeds whose greedy text reaches EOS after 6 / 4 tokens
def test_eos_ends_generation_and_is_not_emitted(seed):
    target = ToyBackend(6, seed=seed, eos_id=5)
    ignoring = steps.generate(target, None, [0, 1, 2], SamplingParams(max_new_tokens=50, ignore_eos=True), 0)
    cut = ignoring.token_ids.index(5)
    for k in (0, 2, 8):
        res = steps.generate(target, NgramProposer(1, 3), [0, 1, 2], SamplingParams(max_new_tokens=50), k)
        assert res.finish_reason == "stop" and res.token_ids == ignoring.token_ids[:cut]


def test_context_full_ends_with_length():
    target = ToyBackend(6, seed=5, n_ctx=20)
    res = steps.generate(target, NgramProposer(1, 3), [0, 1, 2], SamplingParams(max_new_tokens=100), 4)
    assert res.finish_reason == "length" and len(res.token_ids) + 3 == 20


def test_streamed_text_holds_back_incomplete_utf8(smollm):
    pieces: list[str] = []
    res = smollm.generate("Write the word café three times:", SamplingParams(max_new_tokens=24),
                          on_text=pieces.append)
    assert "".join(pieces) == res.text
    assert "\ufffd" not in "".join(pieces)


@pytest.mark.parametrize("k", [0, 4])
def test_tokens_shown_as_other_text_change_the_text_not_the_tokens(k):
    """SamplingParams.shown_as (the server's tool-call tags): each such token reads as its text."""
    target = ToyBackend(6, seed=5)
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]
    plain = _plain_text(target, prompt, 20)
    marked = steps.generate(target, NgramProposer(1, 3), prompt,
                            SamplingParams(max_new_tokens=20, shown_as=((plain.token_ids[0], "\ufdd0"),)), k)
    assert marked.token_ids == plain.token_ids
    expected = "".join("\ufdd0" if t == plain.token_ids[0] else target.token_bytes(t).decode()
                       for t in plain.token_ids)
    assert marked.text == expected and marked.text != plain.text
