"""/v1/completions takes `prompt` in OpenAI's four forms (a string, a list of strings, a
list of token ids, a list of token-id lists) and answers several prompts with one choice
each, in order, each exactly what the prompt alone gets under speculation (docs/server.md#endpoints)."""

from __future__ import annotations

import httpx
import pytest

from speclm import LLM, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.server import ServerConfig, create_app

from .test_server import C, client, live


@pytest.fixture(scope="module")
def served():
    llm = LLM(target=ToyBackend(26, seed=4, n_ctx=256), draft=ToyBackend(26, seed=8, order=1, n_ctx=256))
    app = create_app(llm, ServerConfig(model_id="toy", max_concurrency=4, default_spec=SpecConfig("sd-draft", 4)))
    with live(app) as (url, _):
        yield llm, url
    llm.close()


def ask(url: str, prompt, method: str = "sd-draft", **kw) -> dict:
    r = httpx.post(url + C, json={"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 1,
                                  "speculative": {"method": method}, **kw}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_four_forms_answer_the_same_text(served):
    llm, url = served
    texts = ["abcab", "zyxw", "aaab"]
    ids = [llm.encode(t) for t in texts]
    alone = [ask(url, t, "ar")["choices"][0] for t in texts]
    for form in (texts, ids):
        body = ask(url, form)
        assert [c["index"] for c in body["choices"]] == [0, 1, 2]
        assert [(c["text"], c["logprobs"]["token_logprobs"]) for c in body["choices"]] == \
            [(c["text"], c["logprobs"]["token_logprobs"]) for c in alone]
        assert body["usage"]["completion_tokens"] == sum(len(c["logprobs"]["tokens"]) for c in alone)
    assert ask(url, ids[1])["choices"][0]["text"] == alone[1]["text"]
    assert ask(url, [texts[2]])["choices"][0]["text"] == alone[2]["text"]


def test_several_prompts_through_the_openai_client(served):
    _, url = served
    r = client(url).completions.create(model="toy", prompt=[[0, 1, 2], [3, 4]], max_tokens=5, temperature=0)
    assert [c.index for c in r.choices] == [0, 1] and all(c.finish_reason for c in r.choices)


@pytest.mark.parametrize("body,words", [
    ({"prompt": []}, "empty list"),
    ({"prompt": [[]]}, "empty"),
    ({"prompt": ["ab", "cd"], "stream": True}, "one prompt per request"),
    ({"prompt": [[1, 2], [99]]}, "prompt[1]"),
    ({"prompt": ["ab"] * 65}, "at most 64"),
])
def test_bad_prompt_lists_are_400s(served, body, words):
    _, url = served
    r = httpx.post(url + C, json={"max_tokens": 3, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"], r.json()
