"""What each key may read and do (speclm/server/access.py): tenants, the operator,
loopback without an operator key, and anyone; and the model card's identities.
A remote client is simulated through uvicorn's proxy headers, which it trusts
from 127.0.0.1 (a reverse proxy on this machine)."""

from __future__ import annotations

import hashlib

import httpx
import openai
import pytest

from speclm.models.catalog import identify
from speclm.server import ServerConfig, create_app
from speclm.server.tenants import tenant_id

from .test_server import C, client, live, scrape, toy_llm

OPERATOR, A, B = "operator-key", "key-a", "key-b"
REMOTE = {"X-Forwarded-For": "203.0.113.7"}  # a client elsewhere, through a proxy on this machine


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed():
    app = create_app(toy_llm(), ServerConfig(model_id="toy", api_keys=(A, B), operator_key=OPERATOR))
    with live(app) as (url, _):
        yield url


def test_metrics_are_the_operators_and_name_every_tenant(keyed):
    client(keyed, A).completions.create(model="toy", prompt="abc", max_tokens=3,
                                        extra_body={"speculative": {"method": "sd-suffix"}})
    for headers, status in [({}, 401), (bearer("wrong"), 401), (bearer(A), 403), (bearer(B), 403)]:
        r = httpx.get(keyed + "/metrics", headers=headers)
        assert r.status_code == status and tenant_id(A) not in r.text, r.text
        assert r.json()["error"]["code"] == ("invalid_api_key" if status == 401 else "permission_denied")
    m = scrape(keyed, **bearer(OPERATOR))
    assert m[("speclm_suffix_cache_requests", (("scope", tenant_id(A)),))] == 1


def test_health_says_up_and_ready_to_anyone_and_more_to_the_operator(keyed):
    for headers in ({}, bearer(A), bearer("wrong"), REMOTE):
        r = httpx.get(keyed + "/health", headers=headers)
        assert r.status_code == 200 and r.json() == {"status": "ok", "ready": True}
    detailed = httpx.get(keyed + "/health", headers=bearer(OPERATOR)).json()
    assert detailed["model"] == "toy" and (detailed["running"], detailed["queued"]) == (0, 0)


def test_the_operator_key_is_no_tenant_key(keyed):
    with pytest.raises(openai.PermissionDeniedError):
        client(keyed, OPERATOR).models.list()
    with pytest.raises(openai.AuthenticationError):
        client(keyed).completions.create(model="toy", prompt="abc", max_tokens=3)
    assert [m.id for m in client(keyed, A).models.list().data] == ["toy"]


def test_only_the_operator_clears_another_tenants_caches(keyed):
    clear = keyed + "/admin/cache/clear"
    client(keyed, B).completions.create(model="toy", prompt="abc", max_tokens=3,
                                        extra_body={"speculative": {"method": "sd-suffix"}})
    refused = httpx.post(clear, params={"tenant": tenant_id(B)}, headers=bearer(A))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    unnamed = httpx.post(clear, headers=bearer(OPERATOR))
    assert unnamed.status_code == 400 and unnamed.json()["error"]["param"] == "tenant"
    assert httpx.post(clear, params={"tenant": "t-000000000000"}, headers=bearer(OPERATOR)).status_code == 404
    r = httpx.post(clear, params={"tenant": tenant_id(B)}, headers=bearer(OPERATOR))
    assert r.status_code == 200 and r.json()["scope"] == tenant_id(B) and r.json()["suffix_cache"]["requests"] >= 1
    own = httpx.post(clear, headers=bearer(A))
    assert own.status_code == 200 and own.json()["scope"] == tenant_id(A)


def test_without_an_operator_key_metrics_and_details_are_for_loopback_only():
    with live(create_app(toy_llm(), ServerConfig(model_id="toy", api_keys=(A,)))) as (url, _):
        assert httpx.get(url + "/metrics").status_code == 200  # loopback, no key needed
        remote = httpx.get(url + "/metrics", headers={**REMOTE, **bearer(A)})
        assert remote.status_code == 403 and "loopback" in remote.json()["error"]["message"]
        assert "running" in httpx.get(url + "/health").json()
        assert httpx.get(url + "/health", headers=REMOTE).json() == {"status": "ok", "ready": True}
        r = httpx.post(url + "/admin/cache/clear", params={"tenant": tenant_id(A)}, headers=bearer(A))
        assert r.status_code == 403  # nobody administers other tenants without an operator key


def test_the_model_card_names_files_by_name_and_sha256_never_by_path(keyed, tmp_path):
    card = httpx.get(keyed + "/v1/models", headers=bearer(A)).json()["data"][0]["speclm"]
    assert card["target"] == card["lossless_against"] == {"name": "toy(v=26,seed=4,order=2)", "sha256": None}
    local = tmp_path / "mine.gguf"
    local.write_bytes(b"GGUF" + bytes(1000))
    assert identify(local) == ("mine.gguf", hashlib.sha256(local.read_bytes()).hexdigest())
    local.write_bytes(b"GGUF" + bytes(2000))  # rewritten: hashed again
    assert identify(local)[1] == hashlib.sha256(local.read_bytes()).hexdigest()


def test_the_operator_key_must_not_be_an_api_key():
    from speclm.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="operator key"):
        ServerConfig(api_keys=(A,), operator_key=A)
    with pytest.raises(InvalidRequestError, match="operator key"):
        ServerConfig(operator_key=" padded")
