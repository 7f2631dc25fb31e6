"""The prompt's last chunk carries the first round (Round.lead): the prompt and the first
token cost one forward, as in plain llama.cpp, and nothing emitted changes.

Before, the prompt but its last token was prefilled, and that token was scored as the
first row of the first round: two forwards before the first token (docs/design.md#the-first-token).
"""

from __future__ import annotations

import numpy as np
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.costs import CostModel
from speclm.metrics import RoundRecord
from speclm.speculative import steps
from speclm.speculative.loop import Generation
from speclm.speculative.proposers.draft_model import DraftModelProposer
from speclm.speculative.proposers.ngram import NgramProposer


class ForwardCounter(ToyBackend):
    """A toy target that counts its forwards."""

    forwards = 0

    def score_batch(self, items, last_rows=None, skip_rows=None):
        self.forwards += 1
        return super().score_batch(items, last_rows, skip_rows)


def unfolded(monkeypatch) -> None:
    """The old schedule: every prompt prefilled apart from its first round."""
    monkeypatch.setattr(Generation, "folds_prompt", property(lambda self: False))


def test_the_prompt_and_the_first_token_cost_one_forward():
    target = ForwardCounter(6, seed=3)
    out = steps.generate(target, None, [0, 1, 2, 3, 4], SamplingParams(max_new_tokens=6), 0)
    assert target.forwards == 6  # one for the prompt and token 1, one for each later token
    first = out.rounds[0]
    assert (first.prompt_rows, first.proposed) == (4, 0)
    assert all(r.prompt_rows == 0 for r in out.rounds[1:])


def test_the_first_round_still_drafts_behind_the_prompt():
    target = ToyBackend(6, seed=3)
    out = steps.generate(target, NgramProposer(1, 3), [0, 1, 2, 0, 1, 2, 0, 1], SamplingParams(max_new_tokens=8), 4)
    assert out.rounds[0].prompt_rows == 7 and out.rounds[0].proposed > 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("method", ["ar", "ngram", "draft"])
def test_folding_changes_no_token(monkeypatch, method, temperature):
    """Same tokens, same random draws, with and without the fold (the toy is exact)."""
    prompt = [0, 1, 2, 3, 0, 1]

    def run() -> list[int]:
        proposer = {"ar": None, "ngram": NgramProposer(1, 3),
                    "draft": DraftModelProposer(ToyBackend(6, seed=9, order=1))}[method]
        params = SamplingParams(temperature=temperature, max_new_tokens=30, seed=None)
        np.random.seed(0)
        gen = Generation(ToyBackend(6, seed=3, order=2), proposer, prompt, params, 0 if proposer is None else 3)
        gen.rng = np.random.default_rng(7)
        return steps.run_alone(gen).token_ids
    folded = run()
    unfolded(monkeypatch)
    assert run() == folded


def test_a_folded_round_teaches_no_verify_cost_and_counts_as_prefill():
    cost = CostModel(verify_ms={1: 30.0})
    cost.observe(RoundRecord(proposed=0, accepted=0, draft_ms=0.0, verify_ms=900.0, other_ms=0.0, prompt_rows=300))
    assert cost.verify(1) == 30.0  # a 301-row forward is not v(1)
    out = steps.generate(ToyBackend(6, seed=3), None, [0, 1, 2, 3], SamplingParams(max_new_tokens=5), 0)
    s = out.summary
    assert s.verify_ms == pytest.approx(sum(r.verify_ms for r in out.rounds[1:]))
    assert s.prefill_ms >= out.rounds[0].verify_ms


def test_no_fold_where_hidden_states_are_wanted():
    """With hidden states on, llama.cpp would run the output head over every prompt row."""
    target = ForwardCounter(6, seed=3)
    target.enable_hidden()
    out = steps.generate(target, None, [0, 1, 2, 3], SamplingParams(max_new_tokens=3), 0)
    assert all(r.prompt_rows == 0 for r in out.rounds)
    assert target.forwards == 1 + 3


@pytest.mark.parametrize("k", [0, 4])
def test_a_scored_prompt_folds_with_no_drafts_beside_it(k):
    """Prompt logprobs with tokens to generate: the prompt and the first token are one
    forward of the prompt's rows alone (lm-eval's max_tokens 1 is one forward, as its
    reference computes it), drafting starts at the second round; nothing generated
    (max_new_tokens 0): the prompt alone, no round."""
    from speclm.speculative.proposers.ngram import NgramProposer
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    target = ForwardCounter(6, seed=3)
    params = SamplingParams(max_new_tokens=6, prompt_logprobs=2)
    out = steps.generate(target, NgramProposer(1, 3), prompt, params, k)
    assert out.rounds[0].prompt_rows == len(prompt) - 1 and out.rounds[0].proposed == 0
    plain = steps.generate(ForwardCounter(6, seed=3), None, prompt, params, 0)
    assert out.token_ids == plain.token_ids and out.prompt_logprobs == plain.prompt_logprobs
    assert len(out.prompt_logprobs) == len(prompt)
    only = ForwardCounter(6, seed=3)
    scored = steps.generate(only, None, prompt, SamplingParams(max_new_tokens=0, prompt_logprobs=2), 0)
    assert only.forwards == 1 and not scored.rounds and scored.prompt_logprobs == plain.prompt_logprobs


def test_a_long_prompt_arriving_beside_a_decoding_request_folds_only_its_last_chunk():
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=512), max_sequences=4, suffix_cache_tokens=0)
    jobs = [([0, 1, 2], SamplingParams(max_new_tokens=30), SpecConfig(method="ar")),
            ([1, 2, 3, 4, 5] * 30, SamplingParams(max_new_tokens=5), SpecConfig(method="sd-ngram", k=3))]
    solo = [llm.generate(*job) for job in jobs]
    assert solo[1].rounds[0].prompt_rows == 149  # alone: the whole prompt and token 1 in one forward
    short, long = (llm.start(*job) for job in jobs)
    steps.run_step(llm.target, steps.plan_step([short], 512, prefill_chunk=64))  # short decodes now
    leads = []
    while not (short.finished and long.finished):
        slots = steps.plan_step([g for g in (short, long) if not g.finished], 512, prefill_chunk=64)
        leads += [len(s.round.lead) for s in slots if s.gen is long and s.round is not None and s.round.lead]
        steps.run_step(llm.target, slots)
    assert leads == [149 - 2 * 64]  # two chunks of 64 beside the short one's rows, then the rest carries round 1
    assert [short.result().token_ids, long.result().token_ids] == [r.token_ids for r in solo]


def _llamacpp_batch(llm, batched: bool, last_rows: list, skip_rows: list | None = None):
    """(every row of a block scored alone, what score_batch gives for the same block
    with last_rows / skip_rows, beside a second sequence's 2-token block when batched)."""
    t = llm.target
    ids = llm.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")
    a = t.new_sequence()
    every = t.score(a, ids)
    t.free(a)
    b, c = t.new_sequence(), t.new_sequence()
    t.prefill(c, ids[:5])
    items = [(b, ids), (c, ids[5:7])][:1 + batched]
    got = t.score_batch(items, last_rows[:len(items)], None if skip_rows is None else skip_rows[:len(items)])
    t.free(b)
    t.free(c)
    return every, got


def test_llamacpp_scores_only_the_rows_asked_for_and_the_same_values(smollm):
    every, (last, rest) = _llamacpp_batch(smollm, True, [3, None])
    assert last.shape == (3, smollm.target.vocab_size) and rest.shape == (2, smollm.target.vocab_size)
    assert np.array_equal(last, every[-3:])  # SmolLM2's forwards are batch-invariant here


@pytest.mark.parametrize("batched", [False, True])
def test_llamacpp_leaves_out_the_rows_a_grammar_makes_certain_and_returns_zeros_there(smollm, batched):
    every, got = _llamacpp_batch(smollm, batched, [4, None], [(0, 2), ()])
    assert not got[0][[0, 2]].any()
    assert np.array_equal(got[0][[1, 3]], every[[-3, -1]])


@pytest.mark.parametrize("method", ["ar", "sd-ngram"])
def test_smollm2_greedy_output_is_the_same_folded_or_not(smollm, monkeypatch, method):
    ids = smollm.encode("import numpy as np\n\ndef softmax(x):")
    spec = SpecConfig(method=method, k=4) if method != "ar" else SpecConfig(method="ar")
    folded = smollm.generate(ids, SamplingParams(max_new_tokens=32), spec)
    assert folded.rounds[0].prompt_rows == len(ids) - 1
    unfolded(monkeypatch)
    assert smollm.generate(ids, SamplingParams(max_new_tokens=32), spec).token_ids == folded.token_ids
