"""Shared fixtures: the real small models (SmolLM2-135M; Qwen2.5-Coder-0.5B, whose chat
template writes tool calls) loaded once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm():
    """An LLM over the embedded SmolLM2-135M (no draft)."""
    from speclm import LLM
    llm = LLM(target="smollm2-135m", max_sequences=4)
    yield llm
    llm.close()


@pytest.fixture(scope="session")
def qwen_small():
    """An LLM over the embedded Qwen2.5-Coder-0.5B (no draft): the shipped vocabulary and template."""
    from speclm import LLM
    llm = LLM(target="qwen2.5-coder-0.5b", max_sequences=2)
    yield llm
    llm.close()


def pytest_configure(config):
    """Kernel verdicts (speclm/backends/probe.py) stay in the user's own file even where a
    test points SPECLM_CACHE_DIR at a scratch directory: the machine has not changed."""
    import os
    if "SPECLM_KERNELS_CACHE" not in os.environ:
        from speclm.backends.probe import cache_path
        os.environ["SPECLM_KERNELS_CACHE"] = str(cache_path())
