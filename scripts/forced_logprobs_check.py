"""Speculative against `ar` log-probabilities on tool calls (a grammar's forced runs,
docs/design.md#batch-numerics): a named call and "required" parallel calls, greedy, through
the server in process; prints whether the tokens are the same and how far the logprob
values differ. On speclm's batch-invariant kernels they must be bit-identical:

    SPECLM_NATIVE_ROWS=1-64 python scripts/forced_logprobs_check.py qwen2.5-coder-1.5b speclm
    python scripts/forced_logprobs_check.py qwen2.5-coder-0.5b            # kernels auto"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: speclm and tests' helpers
from speclm import LLM
from speclm.server import ServerConfig, create_app
from tests.test_server import client, live
from tests.test_tool_calls_exact import ADD_TASK, PING, USER

target, kernels = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
llm = LLM(target=target, max_sequences=2, kernels=kernels)
app = create_app(llm, ServerConfig(model_id="m", max_concurrency=1))
named = {"type": "function", "function": {"name": "add_task"}}
cases = {"named": dict(tools=[ADD_TASK], tool_choice=named, max_tokens=120),
         "required": dict(tools=[ADD_TASK, PING], tool_choice="required", max_tokens=200)}
with live(app) as (url, _):
    for name, kw in cases.items():
        out = {}
        for m in ("sd-ngram", "ar"):
            r = client(url).with_options(timeout=900).chat.completions.create(model="m", messages=USER, temperature=0, logprobs=True,
                                                    extra_body={"speculative": {"method": m}}, **kw)
            out[m] = r
        a, b = (out[m].choices[0].logprobs.content for m in ("sd-ngram", "ar"))
        same_tokens = [t.token for t in a] == [t.token for t in b]
        diffs = [abs(x.logprob - y.logprob) for x, y in zip(a, b)]
        nz = [(i, a[i].token, a[i].logprob, b[i].logprob) for i, d in enumerate(diffs) if d]
        print(name, "tokens", len(a), "same_tokens", same_tokens, "max|d|", max(diffs), "n_diff", len(nz),
              "drafted", out["sd-ngram"].usage.model_extra["speculative"].get("drafted"), flush=True)
        print("  first diffs", nz[:6], flush=True)
llm.close()
