"""A long-prediction completion beside a canary (issue 57): prompt "a b a b ...", a prediction of
3500 tokens, max_tokens N, while a 1-token request is sent every 0.5 s; prints the long
request's wall time and usage and the canaries' worst and median wait.

    python scripts/prediction_canary.py PORT N     # against `speclm serve --port PORT`
"""
import json, sys, threading, time, urllib.request
port, n = int(sys.argv[1]), int(sys.argv[2])
def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    return time.monotonic() - t0, out
post({"prompt": "hello", "max_tokens": 1})  # warm
done, waits = threading.Event(), []
def canaries():
    while not done.is_set():
        waits.append(post({"prompt": "Hi", "max_tokens": 1, "temperature": 0})[0])
        time.sleep(0.5)
t = threading.Thread(target=canaries); t.start()
wall, out = post({"prompt": "a b " * 60 + "a", "max_tokens": n, "temperature": 0, "prediction": " a" * 3500})
time.sleep(1.0); done.set(); t.join()
print(json.dumps({"long_request_s": round(wall, 2), "usage": out["usage"], "text_head": out["choices"][0]["text"][:40],
                  "canaries": len(waits), "canary_max_s": round(max(waits), 2),
                  "canary_median_s": round(sorted(waits)[len(waits) // 2], 2)}))
