"""Issue 57's hostile requests (items 1, 3 and 5) against a live `speclm serve` on SmolLM2:
each case's status, `param` and message (or finish_reason, or the stream's error events),
and whether /health still answers after it.

    speclm serve --target smollm2-135m --port 8011 &
    python scripts/hostile_requests.py 8011 [substring of a case name ...]

Before the fix the schema chains kill the server (SIGSEGV): run them last, one server each.
Bodies go out with lone surrogates as JSON escapes, as a careless client sends them."""
import json, sys, time
import httpx
port = int(sys.argv[1]); only = set(sys.argv[2:])
URL = f"http://127.0.0.1:{port}"
C, CHAT = "/v1/completions", "/v1/chat/completions"
U = [{"role": "user", "content": "Give three digits."}]
def chain(n):
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i+1}"}}} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}; return {"$ref": "#/$defs/d0", "$defs": defs}
JS = lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
V = 49152
CASES = [
 # item 3: bias x grammar
 ("force81+regex chat T0", CHAT, {"messages": U, "temperature": 0, "max_tokens": 8, "logit_bias": {"81": 100}, "response_format": {"type": "regex", "regex": "[0-9]{3}"}}, False),
 ("force81+regex chat T1", CHAT, {"messages": U, "temperature": 1, "max_tokens": 8, "logit_bias": {"81": 100}, "response_format": {"type": "regex", "regex": "[0-9]{3}"}}, False),
 ("force81+regex compl stream", C, {"prompt": "Digits:", "temperature": 0, "max_tokens": 8, "logit_bias": {"81": 100}, "response_format": {"type": "regex", "regex": "[0-9]{3}"}}, True),
 ("ban digits+regex chat", CHAT, {"messages": U, "temperature": 0, "max_tokens": 8, "logit_bias": {str(t): -100 for t in range(32, 42)}, "response_format": {"type": "regex", "regex": "[0-9]{3}"}}, False),
 ("ban all vocab T0", C, {"prompt": "Hello", "temperature": 0, "max_tokens": 4, "logit_bias": {str(t): -100 for t in range(V)}}, False),
 ("ban all vocab T1", C, {"prompt": "Hello", "temperature": 1, "max_tokens": 4, "logit_bias": {str(t): -100 for t in range(V)}}, False),
 ("force '1', ban EOS, regex (late)", C, {"prompt": "Digits:", "temperature": 0, "max_tokens": 8, "logit_bias": {"33": 100, "0": -100, "2": -100, "4": -100}, "response_format": {"type": "regex", "regex": "[0-9]{3}"}}, False),
 ("force '1', ban EOS, regex (late) stream", C, {"prompt": "Digits:", "temperature": 1, "max_tokens": 8, "logit_bias": {"33": 100, "0": -100, "2": -100, "4": -100}, "response_format": {"type": "regex", "regex": "[0-9]{3}"}}, True),
 # item 5
 ("bias key ' 12 '", C, {"prompt": "Hi", "max_tokens": 2, "logit_bias": {" 12 ": 5}}, False),
 ("bias key '00012'", C, {"prompt": "Hi", "max_tokens": 2, "logit_bias": {"00012": 5}}, False),
 ("bias key arabic 12", C, {"prompt": "Hi", "max_tokens": 2, "logit_bias": {"\u0661\u0662": 5}}, False),
 ("bias key 5000 digits", C, {"prompt": "Hi", "max_tokens": 2, "logit_bias": {"9" * 5000: 5}}, False),
 ("bias key out of vocab", C, {"prompt": "Hi", "max_tokens": 2, "logit_bias": {"99999": 5}}, False),
 ("prediction lone surrogate (chat)", CHAT, {"messages": U, "max_tokens": 2, "prediction": {"type": "content", "content": "a\ud800b"}}, False),
 ("prediction lone surrogate (compl)", C, {"prompt": "Hi", "max_tokens": 2, "prediction": "a\ud800b"}, False),
 ("prompt lone surrogate", C, {"prompt": "a\ud800b", "max_tokens": 2}, False),
 ("message lone surrogate", CHAT, {"messages": [{"role": "user", "content": "a\ud800b"}], "max_tokens": 2}, False),
 ("named tool_choice, no tool template", CHAT, {"messages": U, "max_tokens": 4, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": {"type": "function", "function": {"name": "f"}}}, False),
 ("unnamed tools, no tool template", CHAT, {"messages": U, "max_tokens": 4, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, False),
 ("echo without logprobs", C, {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "echo": True}, False),
 ("echo with logprobs", C, {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 0}, False),
 ("echo ids without logprobs", C, {"prompt": [9906, 905], "max_tokens": 3, "temperature": 0, "echo": True}, False),
 # late-error grammars
 ("anyOf 5000 branches", CHAT, {"messages": U, "max_tokens": 4, "response_format": JS({"anyOf": [{"const": [i]} for i in range(5000)]})}, True),
 ("lark rule 5000 alternatives", CHAT, {"messages": U, "max_tokens": 4, "response_format": {"type": "lark", "lark": "start: " + " | ".join(f'"w{i}" "x{i}"' for i in range(5000))}}, True),
 ("nested counted regex", CHAT, {"messages": U, "max_tokens": 4, "response_format": {"type": "regex", "regex": "((a{100}b){100}c){100}"}}, True),
 ("arrays 1000x1000 of a{1000}", CHAT, {"messages": U, "max_tokens": 4, "response_format": JS({"type": "array", "minItems": 1000, "maxItems": 1000, "items": {"type": "array", "minItems": 1000, "maxItems": 1000, "items": {"type": "string", "pattern": "^a{1000}$"}}})}, True),
 ("lark chain 5000 rules", CHAT, {"messages": U, "max_tokens": 4, "response_format": {"type": "lark", "lark": "start: r0\n" + "\n".join(f'r{i}: "x" r{i+1}' for i in range(5000)) + '\nr5000: "y"'}}, False),
 ("tools $ref chain 1000", CHAT, {"messages": U, "max_tokens": 4, "tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": chain(1000)}}], "tool_choice": "required"}, False),
 # item 1
 ("schema chain 1000", CHAT, {"messages": U, "max_tokens": 4, "response_format": JS(chain(1000))}, False),
 ("schema chain 2000", CHAT, {"messages": U, "max_tokens": 4, "response_format": JS(chain(2000))}, False),
 ("schema chain 10000", CHAT, {"messages": U, "max_tokens": 4, "response_format": JS(chain(10000))}, False),
]
def health():
    t = time.perf_counter()
    try:
        r = httpx.get(URL + "/health", timeout=5); return f"health {r.status_code} in {time.perf_counter()-t:.2f}s"
    except Exception as e:
        return f"health DOWN ({type(e).__name__})"
for name, path, body, stream in CASES:
    if only and not any(o in name for o in only): continue
    data = json.dumps(body).encode("utf-8", "surrogatepass")
    t = time.perf_counter()
    try:
        if stream:
            body["stream"] = True
            data = json.dumps(body).encode("utf-8", "surrogatepass")
            with httpx.stream("POST", URL + path, content=data, headers={"Content-Type": "application/json"}, timeout=120) as r:
                text = r.read().decode()
            if r.status_code == 200:
                errs = [l for l in text.splitlines() if '"error"' in l]
                fin = [json.loads(l[6:])["choices"][0].get("finish_reason") for l in text.splitlines() if l.startswith("data: {") and '"choices"' in l and json.loads(l[6:])["choices"] and json.loads(l[6:])["choices"][0].get("finish_reason")]
                out = f"200 stream; error events: {[json.loads(e[6:])['error']['message'][:110] for e in errs]}; finish {fin}"
            else:
                e = json.loads(text)["error"]; out = f"{r.status_code} param={e['param']!r} {e['message'][:150]!r}"
        else:
            r = httpx.post(URL + path, content=data, headers={"Content-Type": "application/json"}, timeout=120)
            j = r.json()
            if r.status_code == 200:
                ch = j["choices"][0]
                out = f"200 text={ch.get('text', (ch.get('message') or {}).get('content'))!r} finish={ch['finish_reason']}"
            else:
                e = j["error"]; out = f"{r.status_code} param={e['param']!r} {e['message'][:150]!r}"
    except Exception as e:
        out = f"NO ANSWER ({type(e).__name__}: {str(e)[:80]})"
    print(f"- {name}: {out} [{time.perf_counter()-t:.2f}s; {health()}]", flush=True)
