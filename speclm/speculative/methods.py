"""The method table: every speculation method, one `Method` record each.

The API, the three CLIs (generate, bench, serve), the server's request
validation and the bench read this table and nothing else. Adding a method is
one `register(Method(...))` here (plus its proposer file, and a `Proposal`
record if it drafts in a new way).

A record's factories receive the `Resources` a request may draw on (the
`LLM` implements them: the models, the SSD speculator, the shared caches and
cost models) and the request's settings, seen as a `RequestSpec` (the fields of
speculative/config.SpecConfig they read; config.py imports this table).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..backends.base import Backend
from ..costs import TIMED_K, CostModel
from ..errors import InvalidRequestError
from .controller import Calibration, GoodputController, HeuristicController
from .proposers.base import Proposer
from .proposers.draft_model import DraftModelProposer
from .proposers.medusa import MedusaOptions, MedusaProposer
from .proposers.ngram import NgramProposer
from .proposers.suffix import SuffixProposer
from .proposers.suffix_index import SuffixCache, SuffixConfig
from .ssd.options import SSDOptions


class RequestSpec(Protocol):
    """What a method's factories read of a request's settings (speculative/config.SpecConfig
    has these fields and more)."""

    @property
    def k(self) -> int: ...
    @property
    def proposal(self) -> str | None: ...
    @property
    def p_min(self) -> float: ...
    @property
    def ngram_min(self) -> int: ...
    @property
    def ngram_max(self) -> int: ...
    @property
    def target_threads(self) -> int | None: ...
    @property
    def ssd(self) -> SSDOptions: ...
    @property
    def suffix(self) -> SuffixConfig: ...
    @property
    def medusa(self) -> MedusaOptions: ...
    @property
    def cache_scope(self) -> str | None: ...


class Resources(Protocol):
    """What a method's factories may use, owned by the LLM (speclm.api.LLM implements it)."""

    target: Backend

    @property
    def draft(self) -> Backend: ...
    def speculator(self) -> Any: ...
    def suffix_cache(self, scope: str | None = None) -> SuffixCache | None: ...
    def medusa_heads(self, spec: RequestSpec) -> tuple[Any, Any]: ...
    def cost_model(self, proposal: str | None, k: int, scope: str | None = None) -> CostModel: ...
    def calibration(self, proposal: str | None, scope: str | None = None) -> Calibration: ...
    def proposal_of(self, spec: RequestSpec) -> str | None: ...


Factory = Callable[[Resources, RequestSpec], Any]


@dataclass(frozen=True)
class Proposal:
    """A way of drafting: how to build its proposer, and what is true of it.

    needs_draft: it drafts with the draft model; estimates: its drafts carry a
    per-token acceptance estimate (a goodput controller then keeps the prefix that
    pays); outlives_request(spec): what it learns from a request stays for the
    next ones (so a re-run replays, and tenants need scopes); selectable:
    adaptive methods may draft with it (`SpecConfig.proposal`); predicts: it drafts
    from a client's prediction of the output too (its proposer has `predict(tokens)`)."""

    name: str
    make: Callable[[Resources, RequestSpec], Proposer]
    needs_draft: bool = False
    estimates: bool = False
    outlives_request: Callable[[RequestSpec], bool] = lambda spec: False
    selectable: bool = True
    predicts: bool = False
    description: str = ""


def _ssd_proposer(llm: Resources, spec: RequestSpec) -> Proposer:
    from .ssd.client import SSDProposer
    return SSDProposer(llm.speculator().open, spec.ssd, k=spec.k, p_min=spec.p_min,
                       fallback=lambda: DraftModelProposer(llm.draft, p_min=spec.p_min), name=f"ssd:{llm.draft.name}")


def _medusa_proposer(llm: Resources, spec: RequestSpec) -> Proposer:
    heads, learner = llm.medusa_heads(spec)
    if spec.k > heads.n_heads:
        raise InvalidRequestError(f"method medusa drafts at most {heads.n_heads} tokens a round (its heads file "
                                  f"has {heads.n_heads} heads), got k={spec.k}: pass k <= {heads.n_heads}")
    return MedusaProposer(heads, learner)


PROPOSALS: dict[str, Proposal] = {p.name: p for p in (
    Proposal("draft", lambda llm, spec: DraftModelProposer(llm.draft, p_min=spec.p_min), needs_draft=True,
             description="the draft model, sampled with the request's settings"),
    Proposal("ngram", lambda llm, spec: NgramProposer(spec.ngram_min, spec.ngram_max),
             description="prompt lookup: copy what followed the latest earlier n-gram match"),
    Proposal("suffix", lambda llm, spec: SuffixProposer(llm.suffix_cache(spec.cache_scope), spec.suffix),
             estimates=True, outlives_request=lambda spec: True, predicts=True,
             description="suffix decoding: the longest match in this request and in the LLM's cache of "
                         "earlier verified outputs, per-token acceptance estimates"),
    Proposal("medusa", _medusa_proposer, outlives_request=lambda spec: spec.medusa.online,
             description="Medusa heads: head i drafts token i from the target's own hidden state"),
    Proposal("ssd", _ssd_proposer, needs_draft=True, selectable=False,
             description="the SSD speculator's pre-drafted blocks"),
)}
NO_MODEL_PROPOSAL = "ngram"  # what an adaptive method drafts with when the LLM has no draft model


def _request_threads(llm: Resources, spec: RequestSpec) -> int | None:
    return spec.target_threads


def _ssd_threads(llm: Resources, spec: RequestSpec) -> int | None:
    """A local speculator gets its own threads; the target keeps the rest (at least 1)."""
    if spec.target_threads is not None:
        return spec.target_threads
    cfg = llm.speculator().cfg
    base = getattr(llm.target, "n_threads", None)
    if cfg.addr is not None or base is None:
        return None
    return max(1, base - (cfg.threads or 1))


def _goodput(llm: Resources, spec: RequestSpec) -> GoodputController:
    """Costs and calibration as the request's cache scope learnt them (a tenant's own)."""
    proposal, scope = llm.proposal_of(spec), spec.cache_scope
    return GoodputController(llm.cost_model(proposal, spec.k, scope), k_max=spec.k,
                             calibration=llm.calibration(proposal, scope), per_position=PROPOSALS[proposal].estimates)


def _heuristic(llm: Resources, spec: RequestSpec) -> HeuristicController:
    return HeuristicController(k_init=min(spec.k, 4), k_max=spec.k)


COPY_K = TIMED_K  # the copying methods' K (auto, sd-suffix): the longest block their costs are timed for

@dataclass(frozen=True)
class Method:
    """One speculation method.

    proposal: a PROPOSALS key (None: plain decoding, K = 0); adaptive: the
    request's `proposal` may replace it (and without a draft model it becomes
    NO_MODEL_PROPOSAL); controller(llm, spec): picks K each round (None: fixed
    K); threads(llm, spec): the target's compute threads for the request.
    proposal may also be a Proposal record, which register() adds to PROPOSALS.
    priced: its controller reads the proposal's measured costs (LLM.cost_model), so a
    server measures them before it takes requests (`priced_proposals`).
    """

    name: str
    description: str
    proposal: str | Proposal | None = None
    adaptive: bool = False
    controller: Factory | None = None
    threads: Factory = _request_threads
    default_k: int = 4  # SpecConfig.k when the request does not set it
    in_default_bench: bool = False  # `speclm bench` runs it unless --methods says otherwise
    sync_twin: str | None = None  # the method drafting alike but synchronously (the bench's SSD projection)
    priced: bool = False

    @property
    def uses_k(self) -> bool:
        return self.proposal is not None

    @property
    def baseline(self) -> bool:
        """Plain decoding: what every other method is measured against."""
        return self.proposal is None

    def proposal_for(self, spec: RequestSpec, has_draft: bool) -> str | None:
        """The PROPOSALS key this request drafts with (None: plain decoding)."""
        if not self.adaptive:
            return self.proposal
        if spec.proposal is not None:
            return spec.proposal
        return self.proposal if has_draft or not PROPOSALS[self.proposal].needs_draft else NO_MODEL_PROPOSAL

    def needs_draft(self, spec: RequestSpec, has_draft: bool = True) -> bool:
        kind = self.proposal_for(spec, has_draft)
        return kind is not None and PROPOSALS[kind].needs_draft

    def outlives_request(self, spec: RequestSpec, has_draft: bool = True) -> bool:
        """Whether a request's drafting teaches later requests (Proposal.outlives_request)."""
        kind = self.proposal_for(spec, has_draft)
        return kind is not None and PROPOSALS[kind].outlives_request(spec)


METHODS: dict[str, Method] = {}
DEFAULT_METHOD = "auto"  # never measurably slower than plain decoding: it falls back to it


def register(method: Method) -> Method:
    """Add (or replace) a method; every surface sees it from then on."""
    if isinstance(method.proposal, Proposal):
        PROPOSALS[method.proposal.name] = method.proposal
        method = dataclasses.replace(method, proposal=method.proposal.name)
    if method.proposal is not None and method.proposal not in PROPOSALS:
        raise ValueError(f"method {method.name}: unknown proposal {method.proposal!r}")
    METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (and its proposal, when no other method drafts with it)."""
    method = METHODS.pop(name, None)
    if method is not None and method.proposal is not None and not PROPOSALS[method.proposal].selectable \
            and all(m.proposal != method.proposal for m in METHODS.values()):
        PROPOSALS.pop(method.proposal, None)


def get_method(name: str) -> Method:
    """The method `name`; InvalidRequestError listing the known names otherwise."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise InvalidRequestError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}") from None


def priced_proposals(spec: RequestSpec, has_draft: bool) -> set[str]:
    """The proposals whose measured costs a request may read when `spec` is its default
    (requests choose the method, not what an adaptive one drafts with)."""
    kinds = {m.proposal_for(spec, has_draft) for m in METHODS.values() if m.priced}
    return {k for k in kinds if k is not None and (has_draft or not PROPOSALS[k].needs_draft)}


def default_k_note() -> str:
    """Each method's default K, as a setting's help says it ("16 for auto and sd-suffix, ...")."""
    ks: dict[int, list[str]] = {}
    for m in METHODS.values():
        if m.uses_k:
            ks.setdefault(m.default_k, []).append(m.name)
    usual = max(ks, key=lambda k: len(ks[k]))
    named = [f"{k} for {' and '.join(names)}" for k, names in ks.items() if k != usual]
    return ", ".join([*named, f"else {usual}"])


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def selectable_proposals() -> tuple[str, ...]:
    return tuple(name for name, p in PROPOSALS.items() if p.selectable)


register(Method("ar", "plain autoregressive decoding (the baseline)", in_default_bench=True))
register(Method("sd-draft", "speculative decoding with a draft model, fixed K", proposal="draft",
                in_default_bench=True))
register(Method("sd-ngram", "speculative decoding with prompt lookup (n-gram), fixed K", proposal="ngram",
                in_default_bench=True))
register(Method("sd-suffix", "suffix decoding: drafts from this request and earlier verified outputs, "
                             "fixed K", proposal="suffix", default_k=COPY_K))
register(Method("auto", "goodput controller: K chosen every round from measured costs and acceptance "
                        "(per drafted token, for suffix decoding), K = 0 (plain decoding) when speculation "
                        "does not pay", proposal="suffix", adaptive=True, controller=_goodput, default_k=COPY_K,
                priced=True))
register(Method("medusa", "Medusa heads on the target's hidden state (speclm heads train), fixed K "
                          "(at most the number of heads); --heads-online adapts them from verification",
                proposal="medusa", default_k=3))
register(Method("heuristic", "K += 2 after a full acceptance, else K -= 1 (up to k)",
                proposal="draft", adaptive=True, controller=_heuristic))
register(Method("ssd", "speculative speculative decoding: a speculator process pre-drafts the next block "
                       "for the likely outcomes while the target verifies", proposal="ssd", threads=_ssd_threads,
                sync_twin="sd-draft"))
