"""Speculative sampling reproduces the target distribution exactly (the rule of
requests without a seed: min(1, p/q) acceptance and residual resampling; seeded
requests are tested in tests/test_lossless_harness.py).

Each case draws N independent generations of 3 tokens on the exact toy
backend and compares their empirical distribution with the enumerated target
distribution. The allowed total variation comes from the sample size
(tests/stats.py: Bretagnolle–Huber–Carol, failure probability 1e-6 per case).
Drafts are deliberately unlike the target (another seed, another sharpness).
"""

from __future__ import annotations

import pytest

from speclm.backends.toy import ToyBackend
from speclm.sampling import SamplingParams, sample
from speclm.speculative import loop, steps
from speclm.speculative.proposers.draft_model import DraftModelProposer
from speclm.speculative.proposers.ngram import NgramProposer

from .stats import empirical_check, exact_distribution, support_size, total_variation, tv_bound

VOCAB = 4
N_TOKENS = 3
N_SAMPLES = 8000
PROMPT = [0, 1, 2, 0, 1]  # repeats itself, so the n-gram proposer finds matches


def make_target() -> ToyBackend:
    return ToyBackend(VOCAB, seed=11, order=2, sharpness=1.2)


def make_unlike_draft() -> ToyBackend:
    return ToyBackend(VOCAB, seed=99, order=1, sharpness=2.5)


def sample_first_tokens(proposer_factory, params_kw: dict, k: int, n: int = N_SAMPLES,
                        paths: dict | None = None) -> list[tuple[int, ...]]:
    """n generations; each runs long enough for a full K-token first round
    (max_new_tokens = K + 2), and its first N_TOKENS tokens are kept.
    `paths` (optional) counts accepted and rejected draft tokens."""
    target = make_target()
    out = []
    for _ in range(n):
        params = SamplingParams(max_new_tokens=max(N_TOKENS, k + 2), **params_kw)  # no seed
        proposer = proposer_factory()
        res = steps.generate(target, proposer, PROMPT, params, k)
        if proposer is not None:
            proposer.close()
        out.append(tuple(res.token_ids[:N_TOKENS]))
        if paths is not None:
            paths["accepted"] += res.summary.accepted
            paths["rejected"] += sum(r.rejection_position is not None for r in res.rounds)
            paths["full_k_rounds"] += sum(r.proposed == k for r in res.rounds)
    return out


SETTINGS = {
    "t0.5": dict(temperature=0.5),
    "t1.0": dict(temperature=1.0),
    "t1.5": dict(temperature=1.5),
    "t1.0-topk2": dict(temperature=1.0, top_k=2),
    "t1.5-topp0.8": dict(temperature=1.5, top_p=0.8),
    "t1.0-minp0.2": dict(temperature=1.0, min_p=0.2),
}

PROPOSERS = {
    "draft-model-k2": (lambda: DraftModelProposer(make_unlike_draft()), 2),
    "draft-model-k4": (lambda: DraftModelProposer(make_unlike_draft()), 4),
    "ngram": (lambda: NgramProposer(1, 3), 3),
}


def _cases():
    for s in ("t0.5", "t1.0", "t1.5"):
        for p in PROPOSERS:
            yield s, p
    for s in ("t1.0-topk2", "t1.5-topp0.8", "t1.0-minp0.2"):
        yield s, "draft-model-k2"
        yield s, "ngram"


@pytest.mark.parametrize("setting,proposer", list(_cases()))
def test_speculative_output_matches_target_distribution(setting, proposer):
    factory, k = PROPOSERS[proposer]
    params_kw = SETTINGS[setting]
    exact = exact_distribution(make_target(), PROMPT, SamplingParams(**params_kw), N_TOKENS)
    paths = {"accepted": 0, "rejected": 0, "full_k_rounds": 0}
    samples = sample_first_tokens(factory, params_kw, k, paths=paths)
    tv, bound = empirical_check(samples, exact)
    assert tv < bound, f"TV {tv:.4f} exceeds the sample-size bound {bound:.4f}"
    # the case really exercised acceptance, rejection/resampling and full K-token rounds
    assert paths["accepted"] > N_SAMPLES // 20 and paths["rejected"] > N_SAMPLES // 20, paths
    assert paths["full_k_rounds"] > N_SAMPLES // 20, paths


def test_plain_decoding_matches_target_distribution():
    params_kw = SETTINGS["t1.0"]
    exact = exact_distribution(make_target(), PROMPT, SamplingParams(**params_kw), N_TOKENS)
    tv, bound = empirical_check(sample_first_tokens(lambda: None, params_kw, 0), exact)
    assert tv < bound


def _broken_resample(p, q, rejected, params, rng, at=0):
    """A classic bug: after a rejection, sample from p instead of the residual."""
    return sample(p, rng)


def test_a_broken_resampling_rule_fails_the_same_check(monkeypatch):
    """The check has power: the bug above is caught by the same bound."""
    monkeypatch.setattr(loop, "resample", _broken_resample)
    params_kw = SETTINGS["t1.0"]
    factory, k = PROPOSERS["draft-model-k2"]
    exact = exact_distribution(make_target(), PROMPT, SamplingParams(**params_kw), N_TOKENS)
    tv, bound = empirical_check(sample_first_tokens(factory, params_kw, k), exact)
    assert tv > bound, f"broken rule not detected: TV {tv:.4f} <= bound {bound:.4f}"


def test_a_broken_acceptance_rule_fails_the_same_check(monkeypatch):
    """Accepting every draft token (ignoring p/q) is caught by the same bound."""
    monkeypatch.setattr(loop, "accept", lambda d, p, params, rng, at=0: len(d.tokens))
    params_kw = SETTINGS["t1.0"]
    factory, k = PROPOSERS["draft-model-k2"]
    exact = exact_distribution(make_target(), PROMPT, SamplingParams(**params_kw), N_TOKENS)
    samples = sample_first_tokens(factory, params_kw, k)
    tv, bound = total_variation(samples, exact), tv_bound(len(samples), support_size(exact))
    assert tv > bound, f"broken rule not detected: TV {tv:.4f} <= bound {bound:.4f}"


def test_adaptive_k_keeps_the_target_distribution():
    """K chosen each round from past acceptance (method auto) is still lossless:
    the choice depends only on the past, never on the token being verified."""
    from speclm.costs import CostModel
    from speclm.speculative.controller import GoodputController

    params_kw = SETTINGS["t1.0"]
    exact = exact_distribution(make_target(), PROMPT, SamplingParams(**params_kw), N_TOKENS)
    target = make_target()
    samples, ks = [], set()
    for i in range(N_SAMPLES):
        ctrl = GoodputController(CostModel(verify_ms={1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 5: 1.8}), k_max=4,
                                 alpha_prior=(i % 5) / 5 + 0.05, probe_every=2)
        res = steps.generate(target, DraftModelProposer(make_unlike_draft()), PROMPT,
                            SamplingParams(max_new_tokens=6, **params_kw), 4, controller=ctrl)
        samples.append(tuple(res.token_ids[:N_TOKENS]))
        ks.update(r.proposed for r in res.rounds)
    assert {0, 1} <= ks and max(ks) >= 3  # K really varied, including plain steps
    tv, bound = empirical_check(samples, exact)
    assert tv < bound, f"TV {tv:.4f} exceeds the sample-size bound {bound:.4f}"
