"""speclm on Ray Serve (docs/distributed.md), on one machine: a local cluster of two
nodes, three engine replicas of SmolLM2 behind the ingress, four tenants, and the
SSD speculator as an actor on the node that offers the `speculator` resource.

Outputs are greedy, so every answer must equal the one-process reference token for
token, whichever replica (or retry) produced it. Each replica runs one request at a
time (max_concurrency 1), so batching never changes a replica's numerics.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

ray = pytest.importorskip("ray", reason="Ray Serve is not installed: pip install 'speclm[ray]'")
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from speclm import LLM, SamplingParams, SpecConfig  # noqa: E402
from speclm.distributed.deploy import APP_NAME, application  # noqa: E402
from speclm.distributed.settings import NAMESPACE, RaySettings, ReplicaSpec  # noqa: E402
from speclm.distributed.speculator import NAME as SPECULATOR  # noqa: E402
from speclm.server.config import ServerConfig  # noqa: E402
from speclm.server.tenants import tenant_id  # noqa: E402
from speclm.speculative.ssd.client import SpeculatorConfig  # noqa: E402

from .test_server import wait_until  # noqa: E402

KEYS = ("key-ada", "key-bob", "key-cyd", "key-dee")
OPERATOR = "key-operator"
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\ndef list_files(path):",
           "def is_prime(n):", "# sort a list of numbers\ndef sort(xs):"]
MAX_TOKENS = 24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spec() -> ReplicaSpec:
    llm = dict(target="smollm2-135m", draft="smollm2-135m", n_ctx=1024, kernels=None, kernels_for="speculation",
               max_sequences=1, prefix_cache_tokens=0, suffix_cache_tokens=100_000)
    server = ServerConfig(model_id="smollm2-135m", max_concurrency=1, api_keys=KEYS, operator_key=OPERATOR)
    return ReplicaSpec(llm, server, SpecConfig("sd-suffix"),
                       SpeculatorConfig(threads=1, timeout_s=10.0, start_timeout_s=60.0, restart_backoff_s=0.5),
                       RaySettings(replicas=3, replica_cpus=1.0, speculator_node=True, retries=3))


@pytest.fixture(scope="module")
def cluster():
    """(base url, cluster): two nodes, the second with the speculator resource."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    c.add_node(num_cpus=2, resources={"speculator": 1})
    ray.init(address=c.address, namespace=NAMESPACE)
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(application(_spec()), name=APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}", c
    finally:
        serve.shutdown()
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def reference():
    """prompt -> the one-process greedy text (plain decoding, one thread, as a replica)."""
    llm = LLM(target="smollm2-135m", n_threads=1, max_sequences=1, n_ctx=1024)
    try:
        return {p: llm.generate(p, SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0),
                                SpecConfig("ar")).text for p in PROMPTS}
    finally:
        llm.close()


def _complete(url: str, key: str, prompt: str, **extra) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}
    return httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def _health(url: str) -> dict:
    return httpx.get(url + "/health", headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=30).json()


def _running(url: str) -> list[dict]:
    return [r for r in _health(url)["replicas"] if r["state"] == "running"]


def test_each_tenant_stays_on_one_replica_and_answers_equal_one_process(cluster, reference):
    url, _ = cluster
    assert wait_until(lambda: len(_running(url)) == 3, 60)

    def tenant_run(key: str) -> list[tuple[str, str, str]]:
        out = []
        for prompt in PROMPTS:
            r = _complete(url, key, prompt)
            assert r.status_code == 200, r.text
            out.append((prompt, r.json()["choices"][0]["text"], r.headers["x-speclm-replica"]))
        return out

    with ThreadPoolExecutor(len(KEYS)) as pool:
        runs = dict(zip(KEYS, pool.map(tenant_run, KEYS)))
    homes = {key: {replica for _, _, replica in run} for key, run in runs.items()}
    assert all(len(h) == 1 for h in homes.values()), homes
    assert len(set().union(*homes.values())) >= 2, homes
    for run in runs.values():
        for prompt, text, _ in run:
            assert text == reference[prompt], prompt
    running = _running(url)
    assert set().union(*homes.values()) <= {r["replica"] for r in running}
    assert {r["threads"] for r in running} == {1}  # llama.cpp computes with the one CPU Ray gave each replica

    def metrics() -> str:
        return httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=30).text

    def generations() -> float:  # the replicas report every second
        served = [line for line in metrics().splitlines() if line.startswith("speclm_generations_total{")]
        return sum(float(line.rsplit(" ", 1)[1]) for line in served)

    assert wait_until(lambda: generations() >= len(KEYS) * len(PROMPTS), 10)
    assert tenant_id(KEYS[0]) in metrics()  # the replicas' per-tenant cache figures, joined


def test_the_openai_client_streams_and_needs_a_key(cluster, reference):
    url, _ = cluster
    open_spec = dataclasses.replace(_spec(), server=ServerConfig(model_id="smollm2-135m", max_concurrency=1),
                                    speculator=None, ray=RaySettings(replicas=1))
    serve.run(application(open_spec), name="keyless", route_prefix="/keyless")  # a deployment without keys
    try:
        anyone = openai.OpenAI(base_url=url + "/keyless/v1", api_key="anything", max_retries=0, timeout=120)
        assert anyone.completions.create(model="smollm2-135m", prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                         temperature=0).choices[0].text == reference[PROMPTS[0]]
    finally:
        serve.delete("keyless")
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEYS[1], max_retries=0, timeout=120)
    prompt = PROMPTS[0]
    whole = client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    assert whole.choices[0].text == reference[prompt]
    parts = client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                      stream=True)
    assert "".join(c.choices[0].text for c in parts if c.choices) == reference[prompt]
    chat = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=8, temperature=0, stream=True)
    assert [c for c in chat if c.choices and c.choices[0].finish_reason][-1].choices[0].finish_reason == "length"
    nobody = openai.OpenAI(base_url=url + "/v1", api_key="wrong-key", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        nobody.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=prompt, max_tokens=4)


def _ssd(url: str, prompt: str) -> dict:
    r = _complete(url, KEYS[2], prompt, speculative={"method": "ssd", "k": 3})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_speculator_actor_serves_ssd_and_its_loss_changes_no_output(cluster, reference):
    url, c = cluster
    speculator = ray.get_actor(SPECULATOR, namespace=NAMESPACE)
    info = ray.get(speculator.info.remote())
    node = {n["NodeID"][:12]: n for n in ray.nodes()}[info["node"]]
    assert node["Resources"].get("speculator") == 1  # on the node that offers the resource
    before = _ssd(url, PROMPTS[1])
    assert before["choices"][0]["text"] == reference[PROMPTS[1]]
    assert before["usage"]["speculative"]["cache_hit_rate"] > 0  # blocks pre-drafted by the actor
    ray.kill(speculator, no_restart=False)  # Ray restarts it, on a new port
    lost = _ssd(url, PROMPTS[3])
    assert lost["choices"][0]["text"] == reference[PROMPTS[3]]
    assert wait_until(lambda: ray.get(ray.get_actor(SPECULATOR, namespace=NAMESPACE).info.remote())["addr"]
                 != info["addr"], 60)

    def resumed() -> bool:
        again = _ssd(url, PROMPTS[1])
        assert again["choices"][0]["text"] == reference[PROMPTS[1]]
        return (again["usage"]["speculative"]["cache_hit_rate"] or 0) > 0

    assert wait_until(resumed, 90)


def _stream(url: str, key: str, prompt: str) -> tuple[str, str | None, str | None]:
    """(text, error message or None, response id) of one streamed completion."""
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    text, error, rid = "", None, None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            return "", json.loads(r.read())["error"]["message"], None
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]["message"]
            else:
                rid = event["id"]
                text += "".join(c["text"] for c in event["choices"])
    return text, error, rid


def test_killing_a_replica_loses_no_request(cluster, reference):
    url, _ = cluster
    assert wait_until(lambda: len(_running(url)) == 3, 90)
    victim = _running(url)[0]

    def one(i: int) -> tuple[str, str, str | None, str | None, bool]:
        key, prompt = KEYS[i % len(KEYS)], PROMPTS[i % len(PROMPTS)]
        if i % 2:
            text, error, rid = _stream(url, key, prompt)
            return prompt, text, error, rid, True
        r = _complete(url, key, prompt)
        if r.status_code != 200:
            return prompt, "", r.json()["error"]["message"], None, False
        return prompt, r.json()["choices"][0]["text"], None, r.json()["id"], False

    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(one, i) for i in range(20)]
        time.sleep(1.0)  # the requests are queued and running on every replica
        ray.kill(ray.get_actor(victim["actor"], namespace="serve"), no_restart=True)
        results = [f.result(timeout=180) for f in futures]
    ids = [rid for *_, rid, _ in results if rid is not None]
    assert len(ids) == len(set(ids))
    for prompt, text, error, _, streamed in results:
        if error is None:
            assert text == reference[prompt]
        else:  # only a stream that had already sent tokens may end in an error event
            assert streamed and text and reference[prompt].startswith(text), (prompt, text, error)
    assert wait_until(lambda: len(_running(url)) == 3 and victim["replica"] not in {r["replica"] for r in _running(url)},
                 90)


def test_the_application_builder_takes_speclm_serve_flags():
    """What `serve run`/`serve deploy` and KubeRay's RayService import: the same flags as `speclm serve`."""
    from speclm.commands.serve import ray_app, ray_spec
    from speclm.commands import build_parser
    app = ray_app({"flags": "--target smollm2-135m --method sd-suffix --replicas 3 --replica-cpus 2 --routing balanced"})
    assert isinstance(app, serve.Application)
    spec = ray_spec(build_parser().parse_args(["serve", "--target", "smollm2-135m", "--replicas", "3"]))
    assert spec.ray.replicas == 3 and spec.llm["target"] == "smollm2-135m" and "n_threads" not in spec.llm
    assert spec.server.max_concurrency == spec.llm["max_sequences"]
