"""Echo scoring as evaluation harnesses send it (`max_tokens: 1, echo: true, logprobs: 1`,
the last entry taken as the generated token): the completion's logprobs end with the
generated token's entry even when it is end-of-sequence (its text empty), as OpenAI's do,
and the entries are the raw model's under speculation as under plain decoding."""

from __future__ import annotations

import numpy as np
import pytest

from speclm import LLM, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.sampling import softmax
from speclm.server import ServerConfig, create_app

from .test_server import client, live

PROMPT = "abcab"


def eos_after(prompt: str) -> int:
    """The toy target's most likely token after `prompt`: made its end-of-sequence token."""
    probe = ToyBackend(26, seed=4, n_ctx=256)
    return int(np.argmax(probe.logits_for(probe.tokenize(prompt, add_special=True))))


@pytest.fixture(scope="module")
def served():
    eos = eos_after(PROMPT)
    llm = LLM(target=ToyBackend(26, seed=4, n_ctx=256, eos_id=eos),
              draft=ToyBackend(26, seed=8, order=1, n_ctx=256, eos_id=eos))
    app = create_app(llm, ServerConfig(model_id="toy", max_concurrency=2, default_spec=SpecConfig("sd-draft", 4)))
    with live(app) as (url, _):
        yield llm, url, eos
    llm.close()


@pytest.mark.parametrize("method", ["ar", "sd-draft"])
def test_an_end_of_sequence_token_keeps_its_entry(served, method):
    llm, url, eos = served
    r = client(url).completions.create(model="toy", prompt=PROMPT, max_tokens=1, echo=True, logprobs=1,
                                       temperature=0, extra_body={"speculative": {"method": method}})
    choice = r.choices[0]
    ids = llm.encode(PROMPT)
    assert choice.text == PROMPT and choice.finish_reason == "stop" and r.usage.completion_tokens == 0
    assert len(choice.logprobs.tokens) == len(ids) + 1 and choice.logprobs.tokens[-1] == ""
    want = float(np.log(softmax(llm.target.logits_for(ids)))[eos])
    assert choice.logprobs.token_logprobs[-1] == pytest.approx(want, abs=1e-9)
    assert choice.logprobs.text_offset[-1] == len(PROMPT)


def test_a_longer_completion_ending_on_eos_lists_it_last(served):
    llm, url, eos = served
    kw = dict(model="toy", prompt="zq", max_tokens=40, logprobs=0, temperature=0)
    ar = client(url).completions.create(**kw, extra_body={"speculative": {"method": "ar"}}).choices[0]
    sd = client(url).completions.create(**kw, extra_body={"speculative": {"method": "sd-draft"}}).choices[0]
    assert (sd.text, sd.logprobs.token_logprobs) == (ar.text, ar.logprobs.token_logprobs)
    ended_on_eos = ar.finish_reason == "stop"
    assert len(ar.logprobs.tokens) == len(ar.text) + ended_on_eos
