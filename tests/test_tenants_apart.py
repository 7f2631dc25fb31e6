"""What a request learns that changes later requests' timing (the controller's
acceptance calibration and its cost model per proposal kind) is kept per cache
scope, like the suffix cache (issue 34, finding 4): one tenant's traffic moves
neither the calibration nor the cost curve another tenant's K is chosen from."""

from __future__ import annotations

import copy

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend

PROMPT = [0, 1, 2, 3, 0, 1, 2, 3]


def toy_llm() -> LLM:
    return LLM(target=ToyBackend(26, seed=4, n_ctx=512), draft=ToyBackend(26, seed=8, order=1, n_ctx=512))


def tenant(scope: str | None) -> SpecConfig:
    return SpecConfig("auto", cache_scope=scope)


def test_another_tenants_traffic_leaves_a_tenants_calibration_and_costs_untouched():
    llm, params = toy_llm(), SamplingParams(max_new_tokens=48)
    llm.generate(PROMPT, params, tenant("b"))
    llm.forget_learnt("b")  # b starts again from the costs measured on this machine
    llm.clear_suffix_cache("b")
    b_calibration, b_costs = copy.deepcopy(llm.calibration("suffix", "b").cells), \
        dict(llm.cost_model("suffix", 16, "b").verify_ms)
    for i in range(30):  # tenant a teaches its own scope: repeated text, long accepted drafts
        llm.generate([i % 26, 1, 2, 3] * 3, params, tenant("a"))
    assert llm.calibration("suffix", "a").cells  # a learnt something
    assert llm.calibration("suffix", "b").cells == b_calibration
    assert llm.cost_model("suffix", 16, "b").verify_ms == b_costs
    # (b's own rounds still move with this machine's timings, which its cost model learns: not compared)
    llm.close()


def test_the_shared_scope_is_one_scope_for_every_request_that_shares_it():
    """cache_scope None (`--share-suffix-cache`): requests learn together, by choice."""
    llm, params = toy_llm(), SamplingParams(max_new_tokens=32)
    llm.generate(PROMPT, params, tenant(None))
    assert llm.calibration("suffix", None) is llm.calibration("suffix", None)
    assert llm.calibration("suffix", None).cells and not llm.calibration("suffix", "c").cells
    llm.close()
