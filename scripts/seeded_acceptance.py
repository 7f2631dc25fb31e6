"""Acceptance of the two sampling rules, per proposer (docs/design.md#seeded-sampling).

A request without a seed is verified by the p/q rule (accept d with probability
min(1, p(d)/q(d)), resample from the residual); a seeded one by the keyed rule
(accept d iff it equals the target's Gumbel-max sample keyed by (seed, position),
a sampled draft drawn with the same position's noise). Both emit the target's
distribution; this script counts what each accepts, on the same prompts, K and
sampling settings, one fresh LLM per rule (so the suffix caches start alike), and
prints one row per proposer. Counts, not speed: run it anywhere.

    python scripts/seeded_acceptance.py --backend toy --requests 200
    python scripts/seeded_acceptance.py --backend smollm2 --requests 8 --max-tokens 64

toy: exact models of vocabulary 26: the draft model the target's own table, flatter
(sharpness 1.4 against 2.0: related, not equal), Medusa heads random at first and adapted online
from every verification, SSD through a speculator process. smollm2: SmolLM2-135M, drafted by its q4_0 requantisation
(prepared on first use, seconds); Medusa needs heads trained for the target, which
SmolLM2 has none of, so it is measured on the toy only.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field

import numpy as np

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.heads.model import MedusaHeads
from speclm.speculative.ssd.client import SpeculatorConfig

TEXT_PROMPTS = [
    "def fibonacci(n):", "The capital of France is", "Once upon a time, in a small village,",
    "import json\n\ndef load_config(path):", "Here are three tips for staying healthy:",
    "class Stack:\n    def __init__(self):", "The mitochondria is", "for i in range(10):\n    print(i)\n",
]


@dataclass
class Tally:
    """Counts of one (proposer, rule) over the requests."""

    drafted: list[int] = field(default_factory=list)  # per request
    accepted: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)

    def add(self, res) -> None:
        self.drafted.append(res.summary.proposed)
        self.accepted.append(res.summary.accepted)
        self.rounds.append(res.summary.rounds)

    @property
    def rate(self) -> float:
        return sum(self.accepted) / max(1, sum(self.drafted))

    @property
    def stderr(self) -> float:
        """Standard error of the ratio estimator over requests (the delta method)."""
        d, a = np.asarray(self.drafted, float), np.asarray(self.accepted, float)
        n = len(d)
        if n < 2 or d.sum() == 0:
            return float("nan")
        r = a.sum() / d.sum()
        return float(math.sqrt(np.sum((a - r * d) ** 2) / (n - 1) / n) / d.mean())

    @property
    def tokens_per_round(self) -> float:
        return (sum(self.accepted) + sum(self.rounds)) / max(1, sum(self.rounds))


def toy_heads(target: ToyBackend, n_heads: int = 4, seed: int = 5, scale: float = 1.5) -> MedusaHeads:
    return MedusaHeads.random(target.vocab_size, target.hidden_size, n_heads, seed, scale)


def toy_llm() -> LLM:
    target = ToyBackend(26, seed=11, order=2, sharpness=2.0, n_ctx=512)
    return LLM(target=target, draft=ToyBackend(26, seed=11, order=2, sharpness=1.4, n_ctx=512),
               heads=toy_heads(target), speculator=SpeculatorConfig(threads=None))


def smollm2_llm() -> LLM:
    from speclm.models.variants import prepare_variant
    prepare_variant("smollm2-135m", "q4_0")
    return LLM(target="smollm2-135m", draft="smollm2-135m@q4_0", n_threads=1, n_ctx=1024,
               speculator=SpeculatorConfig(threads=None))


def prompts(backend: str, n: int, llm: LLM) -> list[list[int]]:
    if backend == "toy":
        rng = np.random.default_rng(0)
        return [[int(t) for t in np.tile(rng.integers(0, 26, 4), 3)] for _ in range(n)]
    return [llm.encode(TEXT_PROMPTS[i % len(TEXT_PROMPTS)]) for i in range(n)]


PROPOSERS = {  # proposer -> the fixed-K method drafting with it
    "ngram": SpecConfig("sd-ngram", k=4, ngram_min=1),
    "suffix": SpecConfig("sd-suffix", k=8),
    "draft": SpecConfig("sd-draft", k=4),
    "medusa": SpecConfig("medusa", k=3).with_options(online=True, online_lr=0.05),
    "ssd": SpecConfig("ssd", k=4),
}


def measure(backend: str, n: int, max_tokens: int, temperature: float, top_p: float,
            proposers: list[str]) -> dict[str, dict[str, Tally]]:
    out: dict[str, dict[str, Tally]] = {}
    for rule in ("unseeded", "seeded"):
        llm = toy_llm() if backend == "toy" else smollm2_llm()
        try:
            for name in proposers:
                tally = out.setdefault(name, {}).setdefault(rule, Tally())
                for i, ids in enumerate(prompts(backend, n, llm)):
                    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_tokens,
                                            ignore_eos=True, seed=1000 + i if rule == "seeded" else None)
                    tally.add(llm.generate(ids, params, PROPOSERS[name]))
        finally:
            llm.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("toy", "smollm2"), default="toy")
    ap.add_argument("--requests", type=int, default=200, help="requests per proposer and rule")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--proposers", default=None, help="comma-separated (default: all the backend has)")
    args = ap.parse_args(argv)
    default = list(PROPOSERS) if args.backend == "toy" else ["ngram", "suffix", "draft", "ssd"]
    names = args.proposers.split(",") if args.proposers else default
    table = measure(args.backend, args.requests, args.max_tokens, args.temperature, args.top_p, names)
    print(f"backend {args.backend}, {args.requests} requests x {args.max_tokens} tokens, "
          f"temperature {args.temperature}, top-p {args.top_p}")
    print(f"{'proposer':8} {'K':>2}  {'unseeded (p/q rule)':>26}  {'seeded (keyed rule)':>26}  {'difference':>17}")
    for name, rules in table.items():
        u, s = rules["unseeded"], rules["seeded"]
        diff, se = s.rate - u.rate, math.hypot(s.stderr, u.stderr)
        print(f"{name:8} {PROPOSERS[name].k:>2}  {u.rate:7.3f} ± {u.stderr:.3f} ({sum(u.drafted):6d} dr)"
              f"  {s.rate:7.3f} ± {s.stderr:.3f} ({sum(s.drafted):6d} dr)  {diff:+.3f} ± {se:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
