"""Every method, through the public API, samples exactly the target's distribution.

The harness (tests/stats.py, `check_conditionals`): each case draws n
independent generations on the exact toy backend (vocabulary 5) with
`LLM(target=ToyBackend, draft=ToyBackend).generate(prompt_ids, SamplingParams,
SpecConfig)` and keeps the first K + 3 tokens, so the first round's bonus
token (from p_{K+1}) and a second round are always inside the window. For
every depth t it pools the likelihood-ratio statistic of every conditional
"token t given the t − 1 before it" against the enumerated target
conditional; the threshold comes from the sample counts by a finite-sample
bound (Agrawal's MGF bound for the multinomial KL, Markov, union over depths
and λ), so a correct implementation fails a case with probability < 1e-6.
EOS and stop strings are part of the outcome: a sequence may end early only
at EOS or a completed stop string, and never continues past one.

Grid (every method and every setting appears; not the cross product):

| case                      | method (proposer)  | K | setting                              |
| ------------------------- | ------------------ | - | ------------------------------------ |
| ar-t1.0                   | ar (window 6)      | 0 | temperature 1.0                      |
| sd-draft-t0.3             | sd-draft (unlike)  | 3 | temperature 0.3                      |
| sd-draft-t1.0             | sd-draft (unlike)  | 3 | temperature 1.0                      |
| sd-draft-close-t1.0       | sd-draft (close)   | 3 | temperature 1.0 (many bonus tokens)  |
| sd-draft-t2.0             | sd-draft (unlike)  | 4 | temperature 2.0                      |
| sd-draft-topk3-topp0.5    | sd-draft (unlike)  | 3 | top-k 3 + top-p 0.5                  |
| sd-draft-minp0.2          | sd-draft (unlike)  | 3 | min-p 0.2                            |
| sd-draft-pmin-t1.5-p-minp | sd-draft, p_min 0.4| 4 | temperature 1.5 + top-p 0.9 + min-p 0.1 |
| sd-draft-eos              | sd-draft (unlike)  | 3 | temperature 1.0, EOS in the vocabulary |
| sd-ngram-t1.0             | sd-ngram           | 3 | temperature 1.0                      |
| sd-ngram-t1.5-p-minp      | sd-ngram           | 3 | temperature 1.5 + top-p 0.9 + min-p 0.1 |
| auto-draft-t1.0           | auto (draft)       | 3 | temperature 1.0                      |
| auto-ngram-topk3-topp0.5  | auto (ngram)       | 3 | top-k 3 + top-p 0.5                  |
| heuristic-draft-minp0.2   | heuristic (draft)  | 4 | min-p 0.2                            |
| heuristic-ngram-stop      | heuristic (ngram)  | 3 | temperature 1.0, two stop strings    |
| ssd-t1.0                  | ssd (defaults; speculator process) | 3 | temperature 1.0        |
| sd-suffix-t1.0            | sd-suffix (cache of earlier runs) | 3 | temperature 1.0         |
| auto-suffix-topk3-topp0.5 | auto (suffix, per-token estimates) | 3 | top-k 3 + top-p 0.5    |
| medusa-t1.0               | medusa (random heads, unlike)      | 3 | temperature 1.0        |
| medusa-online-topk3-topp0.5 | medusa, heads adapted online     | 3 | top-k 3 + top-p 0.5    |
| auto-medusa-minp0.2       | auto (medusa)                      | 3 | min-p 0.2              |
| sd-draft-penalties        | sd-draft (unlike)  | 3 | T 1.0, logit_bias (+1.5, ban), presence 0.8, frequency 0.9 |
| sd-ngram-repetition-topp  | sd-ngram           | 3 | T 1.0, repetition 1.8, frequency 0.5, top-p 0.9 |
| auto-suffix-penalties     | auto (suffix)      | 3 | the sd-draft-penalties processors, top-k 4 |
| ssd-penalties             | ssd                | 3 | the sd-draft-penalties processors |
| sd-draft-grammar          | sd-draft (unlike)  | 3 | T 1.0, a regex grammar (forbidden drafts, forced tokens, EOS) |
| sd-ngram-grammar-topp     | sd-ngram           | 3 | T 1.0, top-p 0.9, the regex grammar |
| auto-suffix-grammar       | auto (suffix)      | 3 | T 1.0, the regex grammar, the penalties |
| ssd-grammar               | ssd                | 3 | T 1.0, the regex grammar |

The processor cases (logit_bias, penalties) are checked against an independent
reference of OpenAI's and llama.cpp's definitions (`reference_logits`), and
their control processes every row of a block with the block's first prefix.
The grammar cases' reference mask is Python's `re` (a token is allowed iff some
completion of the text with it matches; EOS iff the text matches), independent
of llguidance; their control masks every row with the block's first state.

The suffix cases run every generation on one LLM, so each draws from a cache
filled by the earlier generations (other seeds: text that differs from this
request's own sample path). The medusa heads are random (seeded) residual
blocks over a random output matrix on the toy's hidden state (one-hot of the
last two tokens), so q differs strongly from p; in the online case every
round's verification updates them (a large learning rate), so later
generations draft from heads that earlier ones changed.

Filters (top-k/top-p/min-p) run at K ≥ 3 throughout. The unlike draft has
another seed and is flatter than the target; the close draft shares the
target's table (flatter), so most rounds are fully accepted. `auto` runs on
frozen synthetic costs under which speculation pays (the toy's microsecond
timings would make its K choice depend on machine load).

Negative controls (the same harness must reject them, on a grid case the
real code passes, with N_NEGATIVE = 3000 generations): a bonus token drawn
from p_K instead of p_{K+1} (sd-draft-close-t1.0; measured S/threshold 6.2 at
depth 4); a draft whose q is reported without the min-p filter it was sampled
with (sd-draft-minp0.2; 5.8 at depth 1); accepting every draft token (55);
medusa drafts sampled from the heads but reported with a uniform q (medusa-t1.0);
penalties and bias applied to every row with the block's first prefix
(sd-draft-penalties).
Under the real code every case stays below 0.4 of its threshold.

Sample sizes: N = 4000 per case (ssd 2000: each round is a round trip to the
speculator process). The file ran in 93 s on 2 cores shared with other work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import TOY_ALPHABET, ToyBackend
from speclm.heads.model import MedusaHeads
from speclm.metrics import GenerationResult, RoundRecord
from speclm.constraints import Grammar, GrammarMask
from speclm.sampling import sample, target_probs
from speclm.speculative import loop, steps
from speclm.costs import CostModel
from speclm.speculative.proposers.draft_model import DraftModelProposer

from .stats import Verdict, check_conditionals

V = 5
EOS = 3  # token "d" ends the text in the EOS case
PROMPT = [0, 1, 2, 0, 1]  # repeats itself, so prompt lookup finds matches
N = 4000  # generations per grid case
N_SSD = 2000  # ssd round-trips to a speculator process: ~6x the cost of a round
N_NEGATIVE = 3000


def make_target(eos: bool = False) -> ToyBackend:
    return ToyBackend(V, seed=11, order=2, sharpness=1.2, eos_id=EOS if eos else None)


def unlike_draft() -> ToyBackend:
    """Another table, flatter than the target: many rejections."""
    return ToyBackend(V, seed=99, order=2, sharpness=0.7)


def close_draft() -> ToyBackend:
    """The target's own table, a little flatter: most rounds fully accepted."""
    return ToyBackend(V, seed=11, order=2, sharpness=1.0)


def toy_heads(target: ToyBackend, n_heads: int = 3, seed: int = 5, scale: float = 1.5) -> MedusaHeads:
    """Random Medusa heads over the toy's hidden state: distributions unlike the target's."""
    return MedusaHeads.random(target.vocab_size, target.hidden_size, n_heads, seed, scale)


class FrozenCosts(CostModel):
    """A cost curve on which speculation pays; it does not learn the toy's timings."""

    def __init__(self) -> None:
        super().__init__(verify_ms={1: 1.0, 2: 1.04, 3: 1.08, 4: 1.12, 5: 1.16}, draft_ms_per_token=0.02)

    def observe(self, rec: RoundRecord) -> None:
        pass


@dataclass(frozen=True)
class Case:
    name: str
    spec: SpecConfig
    sampling: dict = field(default_factory=dict)
    draft: Callable[[], ToyBackend] = unlike_draft
    eos: bool = False
    stop: tuple[str, ...] = ()
    n: int = N

    @property
    def n_tokens(self) -> int:
        return self.spec.k + 3

    def params(self, seed: int | None = None) -> SamplingParams:
        return SamplingParams(seed=seed, max_new_tokens=self.n_tokens, stop=self.stop, **self.sampling)


T1 = dict(temperature=1.0)
FILTERS = dict(temperature=1.0, top_k=3, top_p=0.5)
MIN_P = dict(temperature=1.0, min_p=0.2)
HOT_FILTERS = dict(temperature=1.5, top_p=0.9, min_p=0.1)
PENALTIES = dict(temperature=1.0, logit_bias={1: 1.5, 4: -100}, presence_penalty=0.8, frequency_penalty=0.9)
REPEATS = dict(temperature=1.0, repetition_penalty=1.8, frequency_penalty=0.5, top_p=0.9)
# a <- forced b; c <- forced b unless after "ab"; EOS once an item is complete
GRAMMAR = dict(temperature=1.0, grammar=Grammar.regex("(abc?|e|cb)+"))
GRID = [
    Case("ar-t1.0", SpecConfig(method="ar", k=3), T1),
    Case("sd-draft-t0.3", SpecConfig(method="sd-draft", k=3), dict(temperature=0.3)),
    Case("sd-draft-t1.0", SpecConfig(method="sd-draft", k=3), T1),
    Case("sd-draft-close-t1.0", SpecConfig(method="sd-draft", k=3), T1, draft=close_draft),
    Case("sd-draft-t2.0", SpecConfig(method="sd-draft", k=4), dict(temperature=2.0)),
    Case("sd-draft-topk3-topp0.5", SpecConfig(method="sd-draft", k=3), FILTERS),
    Case("sd-draft-minp0.2", SpecConfig(method="sd-draft", k=3), MIN_P),
    Case("sd-draft-pmin-t1.5-p-minp", SpecConfig(method="sd-draft", k=4, p_min=0.4), HOT_FILTERS),
    Case("sd-draft-eos", SpecConfig(method="sd-draft", k=3), T1, eos=True),
    Case("sd-ngram-t1.0", SpecConfig(method="sd-ngram", k=3, ngram_min=1, ngram_max=3), T1),
    Case("sd-ngram-t1.5-p-minp", SpecConfig(method="sd-ngram", k=3, ngram_min=1, ngram_max=3), HOT_FILTERS),
    Case("auto-draft-t1.0", SpecConfig(method="auto", k=3, proposal="draft"), T1),
    Case("auto-ngram-topk3-topp0.5", SpecConfig(method="auto", k=3, proposal="ngram", ngram_min=1), FILTERS),
    Case("heuristic-draft-minp0.2", SpecConfig(method="heuristic", k=4, proposal="draft"), MIN_P),
    Case("heuristic-ngram-stop", SpecConfig(method="heuristic", k=3, proposal="ngram", ngram_min=1),
         T1, stop=("ad", "cb")),
    Case("ssd-t1.0", SpecConfig(method="ssd", k=3), T1, n=N_SSD),
    Case("sd-suffix-t1.0", SpecConfig(method="sd-suffix", k=3), T1),
    Case("auto-suffix-topk3-topp0.5", SpecConfig(method="auto", k=3, proposal="suffix"), FILTERS),
    Case("medusa-t1.0", SpecConfig(method="medusa", k=3), T1),
    Case("medusa-online-topk3-topp0.5", SpecConfig(method="medusa", k=3).with_options(online=True, online_lr=0.05),
         FILTERS),
    Case("auto-medusa-minp0.2", SpecConfig(method="auto", k=3, proposal="medusa"), MIN_P),
    Case("sd-draft-penalties", SpecConfig(method="sd-draft", k=3), PENALTIES),
    Case("sd-ngram-repetition-topp", SpecConfig(method="sd-ngram", k=3, ngram_min=1, ngram_max=3), REPEATS),
    Case("auto-suffix-penalties", SpecConfig(method="auto", k=3, proposal="suffix"), dict(PENALTIES, top_k=4)),
    Case("ssd-penalties", SpecConfig(method="ssd", k=3), PENALTIES, n=N_SSD),
    Case("sd-draft-grammar", SpecConfig(method="sd-draft", k=3), GRAMMAR, eos=True),
    Case("sd-ngram-grammar-topp", SpecConfig(method="sd-ngram", k=3, ngram_min=1, ngram_max=3),
         dict(GRAMMAR, top_p=0.9), eos=True),
    Case("auto-suffix-grammar", SpecConfig(method="auto", k=3, proposal="suffix"),
         dict(GRAMMAR, presence_penalty=0.8, frequency_penalty=0.4), eos=True),
    Case("ssd-grammar", SpecConfig(method="ssd", k=3), GRAMMAR, eos=True, n=N_SSD),
]
CASES = {c.name: c for c in GRID}


@dataclass
class Trace:
    """What the generations of one case exercised (besides their tokens)."""

    samples: list[tuple[int, ...]] = field(default_factory=list)
    rounds: int = 0
    with_acceptance: int = 0  # rounds whose target accepted >= 1 draft token
    with_rejection: int = 0
    full: int = 0  # rounds with K >= 1, every draft accepted: a bonus token from p_{K+1}
    second_round: int = 0  # generations that ran >= 2 rounds
    short_first: int = 0  # first rounds that proposed fewer than K tokens
    ks: set[int] = field(default_factory=set)
    ended: dict[str, int] = field(default_factory=dict)  # early ends (< K + 3 tokens) by cause
    miscounted: int = 0  # generations whose Σ emitted != len(token_ids)
    speculated: int = 0  # rounds served through an SSD speculator (hit or miss)
    hits: int = 0  # of those, blocks pre-drafted in time (timing-dependent)
    learner: object = None  # medusa online: the LLM's learner after the case

    def add(self, res: GenerationResult, y: tuple[int, ...], case: Case) -> None:
        self.samples.append(y)
        self.rounds += len(res.rounds)
        self.with_acceptance += sum(r.verified > 0 for r in res.rounds)
        self.with_rejection += sum(r.rejection_position is not None for r in res.rounds)
        self.full += sum(r.proposed > 0 and r.rejection_position is None for r in res.rounds)
        self.second_round += len(res.rounds) >= 2
        self.short_first += res.rounds[0].proposed < case.spec.k
        self.ks.update(r.proposed for r in res.rounds)
        if len(res.token_ids) < case.n_tokens:
            cause = "eos" if y[-1:] == (EOS,) and case.eos else "stop"
            self.ended[cause] = self.ended.get(cause, 0) + 1
        self.miscounted += sum(r.emitted for r in res.rounds) != len(res.token_ids)
        ssd = [r for r in res.rounds if r.info and "hit" in r.info]
        self.speculated += len(ssd)
        self.hits += sum(bool(r.info["hit"]) for r in ssd)


def text_of(tokens: tuple[int, ...]) -> str:
    return "".join(TOY_ALPHABET[t] for t in tokens)


def terminal(case: Case) -> Callable[[tuple[int, ...]], bool]:
    """After this prefix the target stops: EOS was drawn, or a stop string completed."""
    def is_terminal(prefix: tuple[int, ...]) -> bool:
        if case.eos and prefix[-1:] == (EOS,):
            return True
        return any(s in text_of(prefix) for s in case.stop)
    return is_terminal


def run_case(case: Case, n: int | None = None, seeded: bool = False) -> Trace:
    """n generations through the public API: without a seed (the rule of unseeded
    requests), or seeded, with seeds 0..n-1 (keyed noise: sampling.keyed_sample)."""
    target = make_target(case.eos)
    llm = LLM(target=target, draft=case.draft(), heads=toy_heads(target))
    costs = FrozenCosts()
    llm.cost_model = lambda *args, **kwargs: costs  # auto: frozen synthetic costs (see docstring)
    is_terminal, trace = terminal(case), Trace()
    try:
        for i in range(case.n if n is None else n):
            res = llm.generate(PROMPT, case.params(seed=i if seeded else None), case.spec)
            y = tuple(res.token_ids[:case.n_tokens])
            if case.eos and len(y) < case.n_tokens and not is_terminal(y) and res.finish_reason == "stop":
                y += (EOS,)  # ended by EOS (never in token_ids): EOS is the outcome's last token
            trace.add(res, y, case)
        trace.learner = next(iter(llm._learners.values()), None)
    finally:
        llm.close()
    return trace


def reference_logits(logits: np.ndarray, prefix: tuple[int, ...], params: SamplingParams) -> np.ndarray:
    """The processed logits after PROMPT + prefix, written from the definitions alone:
    logit_bias added (-100 bans), llama.cpp's repetition penalty over the last 64 context
    tokens, then OpenAI's presence and frequency penalties over the output (`prefix`)."""
    x = logits.astype(np.float64)
    for token, bias in params.logit_bias:
        x[token] = -np.inf if bias == -100 else x[token] + bias
    if params.repetition_penalty != 1.0:
        for token in set([*PROMPT, *prefix][-64:]):
            x[token] = x[token] / params.repetition_penalty if x[token] > 0 else x[token] * params.repetition_penalty
    for token in set(prefix):
        x[token] -= params.presence_penalty + params.frequency_penalty * prefix.count(token)
    if params.grammar is not None:
        x[~reference_allowed(params.grammar.text, prefix)] = -np.inf
    return x


def reference_allowed(pattern: str, prefix: tuple[int, ...]) -> np.ndarray:
    """Which tokens a regex grammar allows after prefix, by Python's `re`: a text token iff
    some completion of at most 3 more characters matches the whole (every item of the
    grammars here is at most 3 long), EOS iff the text matches already."""
    import itertools
    import re
    text, letters = text_of(prefix), [c for i, c in enumerate(TOY_ALPHABET[:V]) if i != EOS]
    allowed = np.zeros(V, dtype=bool)
    allowed[EOS] = re.fullmatch(pattern, text) is not None
    for i, c in enumerate(TOY_ALPHABET[:V]):
        if i != EOS:
            allowed[i] = any(re.fullmatch(pattern, text + c + "".join(rest))
                             for n in range(4) for rest in itertools.product(letters, repeat=n))
    return allowed


def verdict(case: Case, samples: list[tuple[int, ...]]) -> Verdict:
    target, params, memo = make_target(case.eos), case.params(), {}

    def next_probs(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in memo:
            logits = reference_logits(target.logits_for([*PROMPT, *prefix]), prefix, params)
            memo[prefix] = target_probs(logits, params)
        return memo[prefix]

    return check_conditionals(samples, case.n_tokens, next_probs, terminal(case))


# ---- the grid ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_every_method_and_setting_keeps_the_target_distribution(name: str) -> None:
    """The first K + 3 tokens pass every conditional check; the case really
    exercised what it claims (acceptances, rejections, bonus tokens, second
    rounds, early ends); and each round's delivered count adds up to the output."""
    case = CASES[name]
    trace = run_case(case)
    v = verdict(case, trace.samples)
    assert v.lossless, v.describe()
    assert trace.miscounted == 0, "Σ emitted over rounds differs from len(token_ids)"
    n = len(trace.samples)
    assert trace.second_round > n // 2, trace.second_round
    if case.spec.method == "ar":
        assert trace.ks == {0}
        return
    least = n // 50
    exercised = (trace.with_acceptance, trace.with_rejection, trace.full)
    assert min(exercised) > least, f"(accepting, rejecting, fully accepted) rounds: {exercised}"
    if case.spec.p_min > 0:  # the confidence stop really cut some first blocks short
        assert least < trace.short_first < n - least, trace.short_first
    if case.spec.method in ("auto", "heuristic"):
        assert set(range(1, case.spec.k + 1)) <= trace.ks, trace.ks  # K really varied
    if case.eos or case.stop:
        assert sum(trace.ended.values()) > n // 20, trace.ended
    if case.spec.method == "ssd":  # rounds went through the speculator (hits depend on timing)
        assert trace.speculated > n, (trace.speculated, trace.hits)
    if case.spec.medusa.online:  # the heads really learnt during the case
        learner = trace.learner
        assert learner is not None and learner.updates > n // 10, learner and learner.updates


def test_the_harness_rejects_impossible_outcomes_outright() -> None:
    """A token outside the filtered support, a token after EOS, or an early end
    without EOS each fail the check whatever the statistics say."""
    filtered, eos = CASES["sd-draft-topk3-topp0.5"], CASES["sd-draft-eos"]
    p = target_probs(make_target().logits_for(PROMPT), filtered.params())
    assert verdict(filtered, []).lossless  # nothing sampled, nothing to reject
    cases = [(filtered, (int(np.flatnonzero(p == 0)[0]),), "target probability 0"),
             (eos, (EOS, 0), "continues after the terminal prefix"),
             (eos, (0, 1), "without EOS or a stop string")]
    for case, sample_, reason in cases:
        v = verdict(case, [sample_])
        assert not v.lossless and any(reason in m for m in v.impossible), v.impossible


# ---- negative controls: the harness must reject these -------------------------------
def _bonus_from_p_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a full acceptance, draw the bonus token from p_K (the last draft
    token's distribution) instead of p_{K+1}."""
    real_score, real_resample, last = steps.score, loop.resample, {}

    def score(*args, **kwargs) -> list[list[np.ndarray] | None]:
        out = real_score(*args, **kwargs)
        if out[0] is not None:  # a round's distributions (not a prefill chunk's)
            last["p"] = out[0]
        return out

    def resample(p, q, rejected, params, rng, at=0) -> int:
        if rejected is None and len(last["p"]) >= 2:
            return sample(last["p"][-2], rng)
        return real_resample(p, q, rejected, params, rng, at)

    monkeypatch.setattr(steps, "score", score)
    monkeypatch.setattr(loop, "resample", resample)


def _q_without_min_p(monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft samples with the request's min-p filter but reports the
    unfiltered distribution as q."""
    real_propose = DraftModelProposer.propose

    def propose(self, context, k, params, rng):
        d = real_propose(self, context, k, params, rng)
        loose = dataclasses.replace(params, min_p=0.0)
        d.q = [target_probs(self.backend.logits_for([*context, *d.tokens[:i]]), loose) for i in range(len(d))]
        return d

    monkeypatch.setattr(DraftModelProposer, "propose", propose)


def _medusa_q_uniform(monkeypatch: pytest.MonkeyPatch) -> None:
    """Medusa samples from its heads but reports a uniform q. (Reporting q one-hot is NOT a
    bug: accepting a fixed guess d with probability p(d) and resampling from p without d is
    exact whatever d was drawn from.)"""
    from speclm.speculative.proposers.medusa import MedusaProposer
    real_propose = MedusaProposer.propose

    def propose(self, context, k, params, rng):
        d = real_propose(self, context, k, params, rng)
        d.q = [np.full(self.heads.vocab_size, 1.0 / self.heads.vocab_size) for _ in d.tokens]
        return d

    monkeypatch.setattr(MedusaProposer, "propose", propose)


def _processed_with_the_blocks_first_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """The classic mistake: every row of a verify block processed as if no draft token
    came before it (the penalties do not count the draft tokens before row i)."""
    from speclm.sampling import Processors
    real = Processors.process
    monkeypatch.setattr(Processors, "process",
                        lambda self, rows, draft: np.stack([real(self, row[None, :], [])[0] for row in rows]))


def _masked_with_the_blocks_first_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row of a verify block masked with the grammar's state before the draft (its
    tokens not consumed); the state then follows the emitted tokens while they are valid."""
    def process(self, rows, draft):
        out = np.array(rows, dtype=np.float64)
        out[:, ~self.allowed()] = -np.inf
        return out

    def advance(self, tokens):
        for t in tokens:
            if self.matcher.is_stopped() or self.valid_prefix([t]) == 0:
                return
            self.matcher.consume_token(t)
    monkeypatch.setattr(GrammarMask, "process", process)
    monkeypatch.setattr(GrammarMask, "advance", advance)


def _accept_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gross: keep every draft token whatever p and q say."""
    monkeypatch.setattr(loop, "accept", lambda d, p, params, rng, at=0: len(d.tokens))


@pytest.mark.parametrize("bug,case_name", [
    (_bonus_from_p_k, "sd-draft-close-t1.0"),
    (_q_without_min_p, "sd-draft-minp0.2"),
    (_accept_everything, "sd-draft-t1.0"),
    (_medusa_q_uniform, "medusa-t1.0"),
    (_processed_with_the_blocks_first_prefix, "sd-draft-penalties"),
    (_masked_with_the_blocks_first_state, "sd-ngram-grammar-topp"),
], ids=["bonus-from-p_K", "q-without-min-p", "accept-everything", "medusa-q-uniform", "first-prefix-processing",
        "first-state-masking"])
def test_the_harness_rejects_a_broken_loop(monkeypatch: pytest.MonkeyPatch, bug, case_name: str) -> None:
    """Each injected bug, on a grid case the real code passes, fails the same
    check with fewer samples than the grid uses."""
    bug(monkeypatch)
    case = CASES[case_name]
    v = verdict(case, run_case(case, N_NEGATIVE).samples)
    assert not v.lossless, f"bug not detected:\n{v.describe()}"


# ---- seeded requests: plain decoding's text, and the target's law ---------------------
N_SEEDED = 200  # per grid case: the identity with ar is exact, the law is ar's (tested at N below)


def ar_twin(case: Case) -> Case:
    """The case's plain decoding: same sampling, EOS, stops and window."""
    return dataclasses.replace(case, name=f"ar-twin-of-{case.name}", spec=SpecConfig(method="ar", k=case.spec.k))


_AR_SEEDED: dict[tuple, list[tuple[int, ...]]] = {}


def seeded_ar(case: Case, n: int) -> list[tuple[int, ...]]:
    """ar's samples for seeds 0..n-1 under the case's settings (shared by the cases that
    differ only in method)."""
    key = (repr(sorted(case.sampling.items())), case.eos, case.stop, case.spec.k, n)  # repr: a bias is a dict
    if key not in _AR_SEEDED:
        _AR_SEEDED[key] = run_case(ar_twin(case), n, seeded=True).samples
    return _AR_SEEDED[key]


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("ar-")])
def test_a_seeded_request_emits_plain_decodings_text_and_keeps_the_target_distribution(name: str) -> None:
    """With a seed, each token is the target's keyed sample at its position
    (sampling.keyed_sample), and a draft token is accepted exactly when it equals it:
    every method's output, for every seed, is ar's with that seed, token for token, in
    every setting of the grid (deterministic drafts, sampled ones drawn with the same
    position's noise, SSD's from its process, Medusa adapting online); the samples pass
    the harness; and the case really speculated (acceptances and rejections)."""
    case = CASES[name]
    trace = run_case(case, N_SEEDED, seeded=True)
    ar = seeded_ar(case, N_SEEDED)
    differing = [i for i, (a, b) in enumerate(zip(ar, trace.samples)) if a != b]
    assert not differing, f"seeds {differing[:5]}: {[(ar[i], trace.samples[i]) for i in differing[:3]]}"
    v = verdict(case, trace.samples)
    assert v.lossless, v.describe()
    assert trace.with_acceptance > N_SEEDED // 20 and trace.with_rejection > N_SEEDED // 20, \
        (trace.with_acceptance, trace.with_rejection)


def test_seeded_plain_decoding_samples_the_target_distribution() -> None:
    """ar with seeds 0..N-1 passes the harness at the grid's sample size: so does every
    method, whose seeded output is ar's (above). Temperature with top-p and min-p, over
    a 7-token window."""
    case = ar_twin(CASES["sd-draft-pmin-t1.5-p-minp"])
    v = verdict(case, seeded_ar(case, N))
    assert v.lossless, v.describe()


def _noise_keyed_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Key each round's noise by the round's index (and the offset in the round) instead
    of the token's position: every token still gets fresh noise, but which noise now
    depends on where the rounds fell."""
    monkeypatch.setattr(loop.Generation, "noise_position", property(lambda gen: 1000 * len(gen.rounds)))


def _noise_keyed_by_seed_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draw every position with the same noise (keyed by the seed, not the position)."""
    from speclm import sampling
    real = sampling.position_uniforms
    monkeypatch.setattr(sampling, "position_uniforms", lambda seed, position, size: real(seed, 0, size))


def test_noise_keyed_by_round_breaks_the_identity_with_plain_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control of the identity test: keyed by round, each emitted token
    still has fresh noise (the law can stay right), but sd-ngram's text for a seed is no
    longer ar's: what the identity test exists to catch."""
    _noise_keyed_by_round(monkeypatch)
    case = CASES["sd-ngram-t1.0"]
    spec, ar = run_case(case, 200, seeded=True).samples, run_case(ar_twin(case), 200, seeded=True).samples
    assert sum(a != b for a, b in zip(ar, spec)) > 20


def test_noise_keyed_by_seed_alone_fails_the_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control of the law: one noise for every position keeps the identity
    (ar and sd-ngram use the same wrong noise) but correlates the tokens, and the
    harness rejects ar's seeded samples."""
    _noise_keyed_by_seed_alone(monkeypatch)
    case = ar_twin(CASES["sd-ngram-t1.0"])
    v = verdict(case, run_case(case, N_NEGATIVE, seeded=True).samples)
    assert not v.lossless, f"bug not detected:\n{v.describe()}"
