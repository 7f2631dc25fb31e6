"""Clients no one here wrote, run against a live server as their users run them
(docs/server.md#clients-checked): lm-evaluation-harness 0.4.13's `local-completions`
scoring a multiple-choice task with token-id prompts (its default) and with strings, and a
pydantic-ai agent with two tools. instructor is not here: it pins `openai` < 3 and speclm's
tests run `openai` 3; its requests are replayed in tests/test_instructor_requests.py.

The lm-eval run is checked against an independent computation: llama-cpp-python itself,
one forward over each (context, continuation) pair's tokens with every row's logits
(scripts/clients_lmeval.py's Reference and compare): its accuracy and normalised accuracy
must equal lm-eval's through speclm, and every prompt lm-eval sent must be the pair's
tokens (or text) exactly."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from speclm.models.catalog import resolve_model
from speclm.server import ServerConfig, create_app

from .test_server import live

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
ITEMS = 16  # of the task's 48 (four choices each: 64 scored pairs a mode)


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(qwen_small):
    app = create_app(qwen_small, ServerConfig(model_id="qwen", max_concurrency=2))
    with live(app) as (url, _):
        yield url


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """A Hugging Face tokenizer written from the GGUF's own vocabulary (lm-eval tokenizes with one)."""
    out = tmp_path_factory.mktemp("tokenizer")
    script("gguf_tokenizer").main(str(resolve_model("qwen2.5-coder-0.5b")), str(out))
    return str(out)


LM_EVAL = """
import json, os, sys
from pathlib import Path
import lm_eval
from lm_eval.tasks import TaskManager
from speclm import LLM
from speclm.models.catalog import resolve_model
from speclm.server import ServerConfig, create_app
from tests.test_server import live
import importlib.util
spec = importlib.util.spec_from_file_location("clients_lmeval", Path("scripts") / "clients_lmeval.py")
clients = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clients)
tokenizer, items = sys.argv[1], int(sys.argv[2])
os.chdir(clients.TASK_DIR)  # the task names its data file relative to where lm-eval runs
gguf = str(resolve_model("qwen2.5-coder-0.5b"))
llm = LLM(target=gguf, max_sequences=2, kernels="repack+tiled")
ref = clients.Reference(gguf, flash_attn=True)
found = {}
with live(create_app(llm, ServerConfig(model_id="qwen", max_concurrency=2))) as (url, _):
    for tokenized in (True, False):
        sent = []
        proxy = clients.start_proxy(url, sent)
        out = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=(f"model=qwen,base_url={proxy}/v1/completions,tokenizer_backend=huggingface,"
                        f"tokenizer={tokenizer},tokenized_requests={tokenized}"),
            tasks=["speclm_mc"], task_manager=TaskManager(include_path=str(clients.TASK_DIR)), limit=items,
            log_samples=True)
        run = {"scores": out["results"]["speclm_mc"], "samples": out["samples"]["speclm_mc"]}
        result = clients.compare(f"tokenized_requests={tokenized}", run, sent, ref, tokenized)
        result.update(items=len(run["samples"]), requests=len(sent), scores=run["scores"]["acc,none"],
                      id_lists=all(isinstance(b["prompt"], list) and isinstance(b["prompt"][0], list) for b in sent))
        found[str(tokenized)] = result
print(json.dumps(found))
"""


def test_lm_eval_scores_equal_llama_cpp_python_computing_them_directly(tokenizer_dir, capsys):
    """lm-eval's own run (`simple_evaluate`, `local-completions`) against a live server, with token-id
    prompts and with strings, and llama-cpp-python computing the same log-likelihoods directly (one
    forward of each pair's tokens, every row's logits, flash attention as the server's context has
    it) on the same kernels (`repack+tiled`, llama-cpp-python's default, in a child process: the
    kernels are the process's): every log-likelihood bit for bit, so the scores too, and every
    prompt lm-eval sent is the pair's tokens (or text) exactly."""
    pytest.importorskip("lm_eval")
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS.parent), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", LM_EVAL, tokenizer_dir, str(ITEMS)], capture_output=True,
                          text=True, timeout=1200, env=env, cwd=str(SCRIPTS.parent))
    assert done.returncode == 0, done.stderr[-3000:]
    with capsys.disabled():  # lm-eval's scores, the reference's and the largest difference, for the record
        print("\n" + "\n".join(line for line in done.stdout.splitlines() if not line.startswith("{")))
    for tokenized, r in json.loads(done.stdout.strip().splitlines()[-1]).items():
        assert r["items"] == ITEMS and r["matched"] == r["pairs"] == 4 * ITEMS, (tokenized, r)
        assert r["equal"] and r["worst"] == 0.0, (tokenized, r)
        assert r["id_lists"] == (tokenized == "True"), (tokenized, r)


ONE_FORWARD = """
import json, sys
import numpy as np
from speclm import LLM, SamplingParams, SpecConfig
from speclm.sampling import token_logprob
llm = LLM(target="qwen2.5-coder-0.5b", max_sequences=2, kernels="repack+tiled")
target, out = llm.target, []
for question in ("France", "Japan", "Canada"):
    ids = llm.encode(f"Question: What is the capital of {question}?\\nAnswer:") + llm.encode(" Paris")
    seq = target.new_sequence()
    rows = target.score(seq, ids)
    target.free(seq)
    want = [token_logprob(rows[i - 1], ids[i], 0, target.token_bytes).logprob for i in range(1, len(ids))]
    want.append(float(token_logprob(rows[-1], int(np.argmax(rows[-1])), 0, target.token_bytes).logprob))
    for method in ("sd-ngram", "ar"):
        r = llm.generate(ids, SamplingParams(max_new_tokens=1, prompt_logprobs=0, logprobs=0), SpecConfig(method=method))
        got = [t.logprob for t in r.prompt_logprobs[1:]] + [t.logprob for t in r.logprobs]
        out.append([question, method, max(abs(a - b) for a, b in zip(got, want)), len(got) == len(want)])
print(json.dumps(out))
"""


def test_a_prompt_scored_with_one_token_generated_is_one_forward_of_its_tokens():
    """lm-eval's scoring request (echo, logprobs, max_tokens 1) is one forward of the prompt's
    tokens: every prompt token's log-probability and the generated token's equal those of
    `Backend.score` over the prompt, bit for bit, under speculation as under `ar` (the
    prompt's rows carry no drafts). On `repack+tiled`, where a row's logits depend on the
    rows scored with it, the code before (the prompt's last row in a forward of its own)
    was 0.028 off on the first question. A child process: the kernels are the process's."""
    done = subprocess.run([sys.executable, "-c", ONE_FORWARD], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(SCRIPTS.parent)})
    assert done.returncode == 0, done.stderr[-3000:]
    for question, method, worst, complete in json.loads(done.stdout.strip().splitlines()[-1]):
        assert complete and worst == 0.0, (question, method, worst)


def test_a_pydantic_ai_agent_calls_its_tools_and_answers(served):
    """Two tools, tool_choice "auto" (pydantic-ai's default): the agent's run calls a tool,
    gets its result back through the template's tool turn, and ends with text."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("qwen", provider=OpenAIProvider(base_url=served + "/v1", api_key="unused"))
    agent = Agent(model, system_prompt="Use the tools when they help, then answer in one sentence.",
                  model_settings={"temperature": 0, "max_tokens": 200})
    called: list[tuple[str, dict]] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        called.append(("get_weather", {"city": city}))
        return f"{city}: 18 °C, light rain"

    @agent.tool_plain
    def convert_currency(amount: float, source: str, target: str) -> str:
        """Convert an amount of money between currencies given as ISO codes (USD, EUR, JPY)."""
        called.append(("convert_currency", {"amount": amount, "source": source, "target": target}))
        return f"{amount} {source} = {amount * 0.9:.2f} {target}"

    result = asyncio.run(agent.run("What is the weather in Paris right now? Use the get_weather tool."))
    assert called and called[0][0] == "get_weather" and "paris" in called[0][1]["city"].lower(), called
    assert isinstance(result.output, str) and result.output.strip()
    kinds = [part.part_kind for message in result.all_messages() for part in message.parts]
    assert "tool-call" in kinds and "tool-return" in kinds and kinds[-1] == "text", kinds
