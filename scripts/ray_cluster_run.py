"""The one-machine Ray cluster run of docs/distributed.md: a local cluster of two
nodes, two deployments of the same model side by side (`affinity`: TenantRouter;
`balanced`: Ray Serve's default), each with REPLICAS engine replicas, then

1. the affinity table: `speclm bench --endpoint .../affinity --endpoint-b .../balanced`
   with four tenants (one copy-heavy category each), acceptance and tokens/s;
2. the router's cost: 1-token requests through the Ray ingress vs a one-process
   `speclm serve` app on the same model;
3. the fault run: 20 requests in flight on the affinity deployment, one replica
   killed; how each ended and how long until the replica was back.

    python scripts/ray_cluster_run.py --out runs/ray1 [--target smollm2-135m]

Measure alone: nothing else on the machine (the bench's own load check is off,
the cluster's idle processes being part of what is measured); the load average
and CPU are recorded in result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import ray
from ray import serve
from ray.cluster_utils import Cluster

from speclm import SpecConfig
from speclm.distributed.deploy import application
from speclm.distributed.settings import NAMESPACE, RaySettings, ReplicaSpec
from speclm.machine import cpu_model
from speclm.server.config import ServerConfig

KEYS = ("tenant-1", "tenant-2", "tenant-3", "tenant-4")
OPERATOR = "operator"
CATEGORIES = "multi-turn-edit,rag-quote,extract,code-edit"
PROMPT = "def quicksort(xs):"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec(target: str, routing: str, replicas: int) -> ReplicaSpec:
    llm = dict(target=target, draft=None, n_ctx=4096, kernels=None, kernels_for="speculation", max_sequences=2,
               prefix_cache_tokens=1 << 16, suffix_cache_tokens=100_000)
    # one request at a time per replica: a batched forward's numerics would let greedy texts differ at
    # near-ties (docs/design.md#batch-numerics), and the fault run compares texts exactly
    server = ServerConfig(model_id=target, max_concurrency=1, api_keys=KEYS, operator_key=OPERATOR)
    return ReplicaSpec(llm, server, SpecConfig("sd-suffix"), None,
                       RaySettings(replicas=replicas, replica_cpus=1.0, routing=routing))


def replicas_of(url: str) -> list[dict]:
    body = httpx.get(url + "/health", headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=30).json()
    return body.get("replicas", [])


def timed(url: str, max_tokens: int = 1, stream: bool = False) -> float:
    """Wall ms of one greedy plain-decoding request (streamed: read to [DONE])."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream,
            "speculative": {"method": "ar"}}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEYS[0]}"},
                      timeout=120) as r:
        r.raise_for_status()
        r.read()
    return (time.perf_counter() - t0) * 1000


def router_cost(ray_url: str, target: str, n: int = 30, stream_tokens: int = 256, streams: int = 5) -> dict:
    """Median wall ms of a 1-token request through Ray and through a one-process app, and
    the extra ms per streamed token of a long stream (each token a Ray stream item)."""
    import uvicorn

    from speclm import LLM
    from speclm.server.app import create_app
    llm = LLM(target=target, n_threads=1, max_sequences=2)
    app = create_app(llm, ServerConfig(model_id=target, max_concurrency=2, api_keys=KEYS, operator_key=OPERATOR))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    local = f"http://127.0.0.1:{port}"
    while not server.started:
        time.sleep(0.05)
    try:
        timed(local), timed(ray_url)
        local_ms, ray_ms, local_stream, ray_stream = [], [], [], []
        for _ in range(n):  # interleaved
            local_ms.append(timed(local))
            ray_ms.append(timed(ray_url))
        for _ in range(streams):
            local_stream.append(timed(local, stream_tokens, True))
            ray_stream.append(timed(ray_url, stream_tokens, True))
    finally:
        server.should_exit = True
        thread.join(10)
        llm.close()
    return {"requests": n, "one_process_ms_p50": statistics.median(local_ms), "ray_ms_p50": statistics.median(ray_ms),
            "overhead_ms_p50": statistics.median(r - lo for r, lo in zip(ray_ms, local_ms)),
            "stream_tokens": stream_tokens, "streams": streams,
            "one_process_stream_ms_p50": statistics.median(local_stream),
            "ray_stream_ms_p50": statistics.median(ray_stream),
            "overhead_ms_per_streamed_token": statistics.median(
                (r - lo) / stream_tokens for r, lo in zip(ray_stream, local_stream))}


def stream(url: str, key: str, prompt: str, max_tokens: int) -> tuple[str, str | None]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "speculative": AR}
    text, error = "", None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=180,
                      headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            return "", f"HTTP {r.status_code}"
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"]["message"]
                else:
                    text += "".join(c["text"] for c in event["choices"])
    return text, error


AR = {"method": "ar"}  # the fault run's requests: plain decoding, so a text depends on nothing but the model


def fault_run(url: str, max_tokens: int) -> dict:
    prompts = [f"# task {i}\ndef function_{i}(x):" for i in range(20)]
    reference = {}
    for p in prompts:  # the same deployment's own greedy answers, before the fault
        r = httpx.post(url + "/v1/completions", json={"prompt": p, "max_tokens": max_tokens, "temperature": 0,
                                                      "speculative": AR},
                       headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=180)
        reference[p] = r.json()["choices"][0]["text"]
    victim = [r for r in replicas_of(url) if r["state"] == "running"][0]

    def one(i: int) -> dict:
        key, p = KEYS[i % 4], prompts[i]
        if i % 2:
            text, error = stream(url, key, p, max_tokens)
            return {"streamed": True, "identical": error is None and text == reference[p], "error": error,
                    "prefix_ok": reference[p].startswith(text)}
        r = httpx.post(url + "/v1/completions", json={"prompt": p, "max_tokens": max_tokens, "temperature": 0,
                                                      "speculative": AR},
                       headers={"Authorization": f"Bearer {key}"}, timeout=180)
        ok = r.status_code == 200
        return {"streamed": False, "identical": ok and r.json()["choices"][0]["text"] == reference[p],
                "error": None if ok else r.json()["error"]["message"], "prefix_ok": ok}

    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(one, i) for i in range(20)]
        time.sleep(1.0)
        killed_at = time.monotonic()
        ray.kill(ray.get_actor(victim["actor"], namespace="serve"), no_restart=True)
        outcomes = [f.result() for f in futures]
    back_s = None
    while time.monotonic() - killed_at < 180:
        live = [r for r in replicas_of(url) if r["state"] == "running" and r["replica"] != victim["replica"]]
        if len(live) >= len([r for r in replicas_of(url) if r["replica"] != victim["replica"]]) and len(live) >= 3:
            back_s = time.monotonic() - killed_at
            break
        time.sleep(0.5)
    return {"requests": 20, "killed": victim["replica"],
            "identical": sum(o["identical"] for o in outcomes),
            "error_events_after_text": sum(o["streamed"] and o["error"] is not None for o in outcomes),
            "errors_non_streamed": sum(not o["streamed"] and o["error"] is not None for o in outcomes),
            "error_texts_prefix_of_reference": all(o["prefix_ok"] for o in outcomes),
            "replica_back_s": back_s, "outcomes": outcomes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--prompts-per-category", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--overhead-only", action="store_true", help="deploy affinity alone and measure the router's cost")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"cpu": cpu_model(), "machine": platform.machine(), "load_before": os.getloadavg(),
                    "target": args.target, "replicas": args.replicas}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2 * args.replicas + 2,
                                                             "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"speculator": 1})
    ray.init(address=cluster.address, namespace=NAMESPACE)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        t0 = time.perf_counter()
        for routing in ("affinity",) if args.overhead_only else ("affinity", "balanced"):
            serve.run(application(spec(args.target, routing, args.replicas)), name=routing, route_prefix=f"/{routing}")
        result["deploy_s"] = round(time.perf_counter() - t0, 1)
        base = f"http://127.0.0.1:{port}"
        result["nodes"] = [{"node": n["NodeID"][:12], "cpus": n["Resources"].get("CPU"),
                            "speculator": n["Resources"].get("speculator", 0)} for n in ray.nodes() if n["Alive"]]
        if args.overhead_only:
            result["router_cost"] = router_cost(f"{base}/affinity", args.target)
            return 0
        result["replicas_by_node"] = {routing: [(r["replica"], r["node"]) for r in replicas_of(f"{base}/{routing}")]
                                      for routing in ("affinity", "balanced")}
        cmd = [sys.executable, "-m", "speclm", "bench", "--endpoint", f"{base}/affinity", "--endpoint-b",
               f"{base}/balanced", "--endpoint-api-key", ",".join(KEYS), "--endpoint-operator-key", OPERATOR,
               "--categories", CATEGORIES, "--prompts-per-category", str(args.prompts_per_category),
               "--max-new-tokens", str(args.max_new_tokens), "--no-wait-quiet", "--out", str(out / "bench")]
        result["bench_command"] = " ".join(cmd[1:])
        subprocess.run(cmd, check=True)
        result["router_cost"] = router_cost(f"{base}/affinity", args.target)
        result["fault_run"] = fault_run(f"{base}/affinity", args.max_new_tokens)
    finally:
        result["load_after"] = os.getloadavg()
        (out / "result.json").write_text(json.dumps(result, indent=1))
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        print(json.dumps({k: v for k, v in result.items() if k != "fault_run"}, indent=1))
        print(json.dumps({k: v for k, v in result.get("fault_run", {}).items() if k != "outcomes"}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
