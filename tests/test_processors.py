"""The OpenAI fields that change what a request samples from or reports, under
speculation: logit_bias and the penalties (per-row logit processors), logprobs
and prompt logprobs, and Predicted Outputs.

Exact on the toy backend: a processed greedy request emits what plain decoding
with the same processors emits, token for token, for every method and K, alone
and batched; logprobs are plain decoding's to the last bit; a prediction never
changes the output. The law of sampled requests under processors is the
harness's (tests/test_lossless_harness.py, the penalties cases).
"""

from __future__ import annotations

import numpy as np
import pytest

from speclm import LLM, InvalidRequestError, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.engine import Engine
from speclm.sampling import Processors, softmax
from speclm.speculative.proposers.prediction import Prediction
from speclm.speculative.proposers.prediction_counts import prediction_counts

PROMPT = [0, 1, 2, 3, 0, 1, 2]
PROCESSED = dict(logit_bias={2: 1.0, 5: -100}, presence_penalty=0.4, frequency_penalty=0.7,
                 repetition_penalty=1.3)
METHODS = [("sd-draft", 1), ("sd-draft", 4), ("sd-ngram", 3), ("sd-suffix", 8), ("auto", 8), ("heuristic", 4)]


def toy_llm(**kw) -> LLM:
    return LLM(target=ToyBackend(8, seed=3, order=2, sharpness=2.0),
               draft=ToyBackend(8, seed=5, order=1), **kw)


@pytest.fixture(scope="module")
def llm():
    with toy_llm() as llm:
        yield llm


# ---- the processors' definitions -----------------------------------------------------
def test_each_processor_follows_its_definition():
    """bias adds (-100 bans, 100 forces); repetition divides positive logits and multiplies
    negative ones of the last 64 context tokens; presence subtracts once per token present
    in the output, frequency per occurrence."""
    row = np.array([[1.0, -1.0, 2.0, 0.5, -0.5]])
    out = Processors(SamplingParams(logit_bias={0: 2.5, 1: -100}), [4]).process(row, [])[0]
    assert out[0] == 3.5 and out[1] == -np.inf and list(out[2:]) == [2.0, 0.5, -0.5]
    out = Processors(SamplingParams(logit_bias={2: 100, 3: 100}), [4]).process(row, [])[0]
    assert list(out[2:4]) == [2.0, 0.5] and np.all(out[[0, 1, 4]] == -np.inf)
    out = Processors(SamplingParams(repetition_penalty=2.0), [0, 1]).process(row, [])[0]
    assert list(out) == [0.5, -2.0, 2.0, 0.5, -0.5]
    pen = Processors(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [4])
    pen.advance([2, 2, 3])
    assert list(pen.process(row, [])[0]) == [1.0, -1.0, 2.0 - 0.5 - 0.5, 0.5 - 0.5 - 0.25, -0.5]


def test_row_i_is_processed_with_the_output_plus_the_drafts_before_it():
    """process(rows, draft)[i] equals processing row i alone after advancing over draft[:i]."""
    params = SamplingParams(**PROCESSED)
    rows = np.random.default_rng(0).standard_normal((5, 8))
    draft = [2, 2, 4, 2]
    whole = Processors(params, PROMPT)
    whole.advance([4, 2])
    block = whole.process(rows, draft)
    for i in range(len(rows)):
        alone = Processors(params, PROMPT)
        alone.advance([4, 2, *draft[:i]])
        assert np.array_equal(block[i], alone.process(rows[i:i + 1], [])[0]), i


# ---- exact under speculation ---------------------------------------------------------
@pytest.mark.parametrize("method,k", METHODS)
def test_processed_greedy_speculation_equals_processed_plain_decoding(llm, method, k):
    params = SamplingParams(max_new_tokens=48, **PROCESSED)
    ar = llm.generate(PROMPT, params, SpecConfig(method="ar"))
    raw = llm.generate(PROMPT, SamplingParams(max_new_tokens=48), SpecConfig(method="ar"))
    assert ar.token_ids != raw.token_ids and 5 not in ar.token_ids  # the processors bite; the ban holds
    sd = llm.generate(PROMPT, params, SpecConfig(method=method, k=k))
    assert sd.token_ids == ar.token_ids
    assert sum(r.proposed for r in sd.rounds) > 0


def test_processed_requests_batched_equal_each_alone(llm):
    """In one engine, requests with different processors emit what each emits alone."""
    settings = [dict(PROCESSED), dict(frequency_penalty=1.5), dict(logit_bias={0: 3.0}), {}]
    alone = [llm.generate(PROMPT, SamplingParams(max_new_tokens=32, **s), SpecConfig(method="sd-ngram", k=4))
             for s in settings]
    engine = Engine(llm, max_concurrency=4)
    try:
        handles = [engine.submit(PROMPT, SamplingParams(max_new_tokens=32, **s), SpecConfig(method="sd-ngram", k=4))
                   for s in settings]
        batched = [h.result(30) for h in handles]
    finally:
        engine.shutdown()
    assert [b.token_ids for b in batched] == [a.token_ids for a in alone]


# ---- logprobs --------------------------------------------------------------------------
@pytest.mark.parametrize("method,k", [("ar", 0), ("sd-draft", 4), ("sd-suffix", 8)])
def test_logprobs_are_plain_decodings_and_the_raw_model_log_probabilities(llm, method, k):
    """Each generated token's logprob and top-3 are log-softmax of the raw logits after
    its prefix (before processors and temperature), whatever the method."""
    params = SamplingParams(max_new_tokens=24, logprobs=3, **PROCESSED)
    res = llm.generate(PROMPT, params, SpecConfig(method=method, k=k))
    assert len(res.logprobs) == len(res.token_ids)
    context = list(PROMPT)
    for tok, lp in zip(res.token_ids, res.logprobs):
        logp = np.log(softmax(llm.target.logits_for(context)))
        assert lp.token == tok and lp.logprob == pytest.approx(logp[tok], abs=1e-12)
        best = sorted(range(logp.size), key=lambda t: (-logp[t], t))[:3]
        assert [t for t, _, _ in lp.top] == best
        assert [x for _, x, _ in lp.top] == pytest.approx(logp[best].tolist(), abs=1e-12)
        context.append(tok)
    ar = llm.generate(PROMPT, params, SpecConfig(method="ar"))
    assert res.logprobs == ar.logprobs


def test_prompt_logprobs_score_the_prompt_and_max_new_tokens_0_only_scores(llm):
    res = llm.generate(PROMPT, SamplingParams(max_new_tokens=0, prompt_logprobs=1), SpecConfig(method="ar"))
    assert res.token_ids == [] and res.finish_reason == "length"
    assert [e.token for e in res.prompt_logprobs] == PROMPT and res.prompt_logprobs[0].logprob is None
    for i in range(1, len(PROMPT)):
        logp = np.log(softmax(llm.target.logits_for(PROMPT[:i])))
        assert res.prompt_logprobs[i].logprob == pytest.approx(logp[PROMPT[i]], abs=1e-12)
    with pytest.raises(InvalidRequestError, match="max_new_tokens must be an integer >= 1"):
        SamplingParams(max_new_tokens=0)


def test_prompt_logprobs_are_computed_even_where_the_prefix_cache_holds_the_prompt():
    with toy_llm(prefix_cache_tokens=10_000) as llm:
        long = PROMPT * 4
        llm.generate(long, SamplingParams(max_new_tokens=4), SpecConfig(method="ar"))
        res = llm.generate(long, SamplingParams(max_new_tokens=4, prompt_logprobs=0), SpecConfig(method="ar"))
    assert res.cached_prompt_tokens == 0 and len(res.prompt_logprobs) == len(long)
    assert all(e.logprob is not None for e in res.prompt_logprobs[1:])


# ---- Predicted Outputs -----------------------------------------------------------------
def edited(tokens: list[int]) -> list[int]:
    """A prediction that differs from the answer: a token changed, two inserted, three deleted."""
    out = list(tokens)
    out[5] = (out[5] + 1) % 8
    return out[:12] + [7, 7] + out[12:20] + out[23:]


@pytest.mark.parametrize("sampling", [dict(), PROCESSED], ids=["greedy", "greedy-processed"])
@pytest.mark.parametrize("method", ["sd-suffix", "auto"])
def test_a_prediction_changes_speed_never_the_output(llm, sampling, method):
    params = SamplingParams(max_new_tokens=48, **sampling)
    ar = llm.generate(PROMPT, params, SpecConfig(method="ar"))
    spec = SpecConfig(method=method, k=8)
    for prediction in (ar.token_ids, edited(ar.token_ids), [1, 2, 3] * 30, []):
        res = llm.generate(PROMPT, params, spec, prediction=prediction)
        assert res.token_ids == ar.token_ids
        assert res.prediction.accepted + res.prediction.rejected == len(prediction)
    with toy_llm() as fresh:  # auto's calibration is the scope's: the unrelated predictions above taught it
        exact = fresh.generate(PROMPT, params, spec, prediction=ar.token_ids)
    assert exact.token_ids == ar.token_ids
    assert exact.prediction.accepted == len(ar.token_ids) and exact.prediction.rejected == 0
    assert exact.summary.rounds < ar.summary.rounds  # the prediction drafted, and paid


def test_a_sampled_request_keeps_its_seeded_text_with_any_prediction(llm):
    params = SamplingParams(max_new_tokens=32, temperature=0.9, seed=7, **PROCESSED)
    ar = llm.generate(PROMPT, params, SpecConfig(method="ar"))
    res = llm.generate(PROMPT, params, SpecConfig(method="sd-suffix", k=8), prediction=edited(ar.token_ids))
    assert res.token_ids == ar.token_ids


def test_the_prediction_is_followed_in_order_and_realigned_after_an_edit():
    p = Prediction([10, 11, 12, 13, 14, 15, 16, 17, 12, 13, 20])
    assert p.draft(3).tokens == (10, 11, 12)
    p.follow([10, 11])
    assert (p.pos, p.run) == (2, 2) and p.draft(2).tokens == (12, 13)
    p.follow([10, 11, 99])  # the answer left it at 12: no place matches 99
    assert p.pos is None and p.draft(4).tokens == ()
    p.follow([10, 11, 99, 12, 13])  # back: the first 12, 13 at or after where it left
    assert p.pos == 4 and p.draft(2).tokens == (14, 15)
    c = p.draft(3).confidence
    assert c[0] < c[1] < c[2] < 1


def test_after_a_substitution_of_as_many_bytes_drafting_resumes_right_after_it():
    """A typo fixed ("teh" -> "the": two tokens replaced by one of as many bytes) resumes after the
    typo, where a one-token match of the common word would jump to its next occurrence."""
    pieces = {1: b" over", 2: b" te", 3: b"h", 4: b" quick", 5: b" fox", 6: b" the", 7: b" dog"}
    tokens = [1, 2, 3, 4, 5, 1, 6, 7]  # " over teh quick fox over the dog"
    p = Prediction(tokens, pieces.__getitem__)
    p.follow([1, 6])  # " over the": left at 1 (" te"); 4 bytes for 4 bytes
    assert p.pos == 3 and p.draft(2).tokens == (4, 5)
    blind = Prediction(tokens)  # without the tokenizer's bytes: the next " the"
    blind.follow([1, 6])
    assert blind.pos == 7 and blind.draft(1).tokens == (7,)


def test_until_the_answer_reaches_the_prediction_its_start_is_the_draft():
    """An answer that opens with a code fence drafts the file's first line, not the line
    after the first newline a one-token match would pick."""
    p = Prediction([10, 11, 5, 12, 13, 5, 14])  # 5: a newline
    p.follow([90, 91, 5])  # "```python\n"
    assert p.pos == 0 and p.draft(2).tokens == (10, 11)
    p.follow([90, 91, 5, 10, 11])
    assert p.pos == 2


def test_prediction_counts_add_up_to_the_prediction():
    counts = prediction_counts([1, 2, 3, 4, 5, 6], [1, 2, 9, 4, 5, 6, 7])
    assert (counts.accepted, counts.rejected) == (5, 1)


def test_methods_that_cannot_use_a_prediction_refuse_it(llm):
    for method in ("ar", "sd-draft", "sd-ngram"):
        with pytest.raises(InvalidRequestError, match=f"prediction is not read by method {method}"):
            llm.generate(PROMPT, SamplingParams(max_new_tokens=4), SpecConfig(method=method), prediction=[1])
    with pytest.raises(InvalidRequestError, match="more than the"):
        llm.generate(PROMPT, SamplingParams(max_new_tokens=4), SpecConfig(method="auto"),
                     prediction=[1] * (llm.target.n_ctx + 1))


# ---- bad values ------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,needle", [
    ("logit_bias", {3: 101}, "logit_bias values must be numbers in [-100, 100]"),
    ("logit_bias", {-1: 1}, "logit_bias keys must be token ids"),
    ("logit_bias", {"x": 1}, "logit_bias keys must be token ids"),
    ("presence_penalty", 2.5, "presence_penalty must be a number in [-2, 2]"),
    ("frequency_penalty", float("nan"), "frequency_penalty must be a number in [-2, 2]"),
    ("repetition_penalty", 0.0, "repetition_penalty must be a number > 0"),
    ("logprobs", 21, "logprobs must be an integer in [0, 20]"),
    ("prompt_logprobs", -1, "prompt_logprobs must be an integer in [0, 20]"),
])
def test_bad_values_are_refused_naming_the_field(field, value, needle):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**{field: value})
    assert needle in str(err.value)


def test_a_bias_on_a_token_outside_the_vocabulary_is_refused(llm):
    with pytest.raises(InvalidRequestError, match="logit_bias names token 8, outside"):
        llm.generate(PROMPT, SamplingParams(logit_bias={8: 1.0}), SpecConfig(method="ar"))


def test_a_request_without_processors_has_none():
    """Plain requests pay nothing for processors: the Generation has none."""
    assert not SamplingParams().processed
    assert all(SamplingParams(**{k: v}).processed for k, v in PROCESSED.items())
    with toy_llm() as llm:
        assert llm.start(PROMPT, SamplingParams(), SpecConfig(method="ar")).processors == []
