"""Shared fixtures: the real small model (SmolLM2-135M) loaded once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm():
    """An LLM over the embedded SmolLM2-135M (no draft)."""
    from speclm import LLM
    llm = LLM(target="smollm2-135m", max_sequences=4)
    yield llm
    llm.close()
