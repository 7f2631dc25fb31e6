"""Rollback is O(1) bookkeeping that leaves the KV exactly at the accepted state.

After scoring a block and rejecting part of it, the next logits must equal
those of a fresh sequence prefilled with the accepted prefix. Toy backend:
exact. llama.cpp: both sides are computed as the same block shape (prefix in
one prefill, then one single-token step), so they must agree to within
ROLLBACK_ATOL; any stale KV entry left behind would move logits by whole units.
"""

from __future__ import annotations

import numpy as np

from speclm.backends.toy import ToyBackend

ROLLBACK_ATOL = 1e-3  # logits


def _rollback_then_step(backend, prompt, block, keep, nxt):
    seq = backend.new_sequence()
    backend.prefill(seq, prompt)
    backend.score(seq, block)             # verify a block ...
    backend.rollback(seq, len(prompt) + keep)  # ... accept `keep` of it
    assert backend.tokens(seq) == prompt + block[:keep]
    logits = backend.score(seq, [nxt])[0]
    backend.free(seq)
    return logits


def _fresh_then_step(backend, prefix, nxt):
    seq = backend.new_sequence()
    backend.prefill(seq, prefix)
    logits = backend.score(seq, [nxt])[0]
    backend.free(seq)
    return logits


def test_toy_rollback_equals_fresh_prefill_exactly():
    b = ToyBackend(6, seed=1, order=3)
    prompt, block = [0, 1, 2, 3], [4, 5, 0, 1, 2]
    for keep in range(len(block) + 1):
        got = _rollback_then_step(b, prompt, block, keep, 3)
        want = _fresh_then_step(b, prompt + block[:keep], 3)
        np.testing.assert_array_equal(got, want)


def test_llamacpp_rollback_equals_fresh_prefill(smollm):
    target = smollm.target
    prompt = target.tokenize("def add(a, b):\n    return")
    wrong_block = target.tokenize(" banana cherry kiwi mango papaya", add_special=False)
    for keep in (0, 1, 3, len(wrong_block)):
        got = _rollback_then_step(target, prompt, wrong_block, keep, wrong_block[0])
        want = _fresh_then_step(target, prompt + wrong_block[:keep], wrong_block[0])
        assert np.abs(got - want).max() < ROLLBACK_ATOL, f"keep={keep}: max diff {np.abs(got - want).max()}"
    assert target.live_sequences == 0


def test_llamacpp_fork_shares_the_prefix_and_diverges_independently(smollm):
    target = smollm.target
    prompt = target.tokenize("The quick brown fox")
    a = target.new_sequence()
    target.prefill(a, prompt)
    b = target.fork(a)
    assert target.tokens(b) == prompt
    la = target.score(a, [target.tokenize(" jumps", add_special=False)[0]])[0]
    lb = target.score(b, [target.tokenize(" sleeps", add_special=False)[0]])[0]
    fresh = _fresh_then_step(target, prompt, target.tokenize(" sleeps", add_special=False)[0])
    assert np.abs(lb - fresh).max() < ROLLBACK_ATOL
    assert np.abs(la - lb).max() > 0.1  # they really are different continuations
    target.free(a)
    target.free(b)
    assert target.live_sequences == 0


def test_the_loop_frees_its_sequences(smollm):
    from speclm import SamplingParams, SpecConfig
    smollm.generate("hello", SamplingParams(max_new_tokens=8), SpecConfig(method="sd-ngram", k=3))
    assert smollm.target.live_sequences == 0
