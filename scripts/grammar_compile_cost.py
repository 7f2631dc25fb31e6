"""The cost per request of the safe grammar compile (docs/server.md#structured-outputs), on
SmolLM2: a new grammar (bounds, the compile worker's round trip, this process's compile on
a big stack), a grammar seen before (the cache: a deep copy), against llguidance's compile
and first steps alone, in process, as before the worker existed. 40 runs each.

    python scripts/grammar_compile_cost.py"""
import json, time, statistics as S
from llguidance import LLMatcher, LLParserLimits
from speclm import LLM, Grammar
from speclm import grammar_safety as gs
from speclm.grammar_bounds import check_bounds
import speclm.constraints as C
from speclm.constraints import GrammarMask, matcher_for, tokenizer_for
llm = LLM(target="smollm2-135m", max_sequences=1)
b = llm.target
tok = tokenizer_for(b)
matcher_for(Grammar.regex("warm[0-9]"), b)  # the worker up, its tokenizer built
def schema(i):
    return {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "maximum": 150 + i},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,10}$"}}}, "required": ["name", "age"]}
def ms(f, n):
    out = []
    for i in range(n):
        t = time.perf_counter(); f(i); out.append((time.perf_counter() - t) * 1000)
    return S.median(out), min(out), max(out)
def direct(i):
    g = Grammar.json_schema(schema(10_000 + i))
    m = LLMatcher(tok, g.source(), log_level=0, limits=LLParserLimits(verbose_errors=False)); m.compute_bitmask(); m.compute_ff_tokens()
def safe_new(i):
    GrammarMask(Grammar.json_schema(schema(i)), b)
def bounds(i):
    check_bounds("json_schema", Grammar.json_schema(schema(20_000 + i)).text)
def worker(i):
    gs.WORKER.check(C._compiled(b).worker_key(), None, Grammar.json_schema(schema(30_000 + i)).source())
cached = Grammar.json_schema(schema(-1)); GrammarMask(cached, b)
def safe_cached(i):
    GrammarMask(Grammar.json_schema(schema(-1)), b)
for label, f in [("llguidance compile + first steps, in process (before)", direct), ("bounds alone", bounds),
                 ("worker round trip alone", worker), ("safe compile, new grammar (after)", safe_new),
                 ("safe compile, grammar seen before (after)", safe_cached)]:
    med, lo, hi = ms(f, 40)
    print(f"{label:55s} median {med:7.3f} ms  (min {lo:.3f}, max {hi:.3f})")
t = time.perf_counter(); gs.WORKER.close(); gs.WORKER._ensure(); matcher_for(Grammar.regex("cold[0-9]"), b)
print(f"worker cold start + SmolLM2 tokenizer + first grammar: {(time.perf_counter()-t)*1000:.0f} ms")
