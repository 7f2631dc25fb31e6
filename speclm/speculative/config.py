"""SpecConfig: how one request speculates. Its fields are declared with
`option(...)`, so the CLIs' flags and the server's request fields come from
here; method-owned settings are nested dataclasses (`ssd`)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from ..sampling import is_int
from .methods import DEFAULT_METHOD, default_k_note, get_method, method_names, selectable_proposals
from ..options import Option, option, options_of
from .proposers.ngram import check_ngram_sizes
from .proposers.medusa import MedusaOptions
from .proposers.suffix_index import SuffixConfig
from .ssd.options import SSDOptions

MAX_K = 32
SECTIONS = {"ssd": SSDOptions, "suffix": SuffixConfig, "medusa": MedusaOptions}  # SpecConfig field -> the dataclass of a method's own settings


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate (`speclm.speculative.methods` lists the methods).

    k: draft tokens per round (for adaptive methods: the maximum; None: the
    method's default_k). proposal: the PROPOSALS key an adaptive method drafts
    with (None: the method's own; `--proposer` on the command line; `proposer=`
    is its deprecated name). ssd, suffix, medusa: those proposals' own settings.
    cache_scope: the LLM's suffix cache (and online-adapted heads) this request
    drafts from and teaches (None: the LLM's default scope); set by the caller, never by a client.
    """

    method: str = option(DEFAULT_METHOD, "speculation method (default auto: K chosen every round from "
                         "measured costs, plain decoding when speculation does not pay)",
                         choices=method_names, request=True)
    k: int | None = option(None, "draft tokens per round (for auto/heuristic: the maximum; "
                           f"default: the method's, {default_k_note()})", kind=int, request=True)
    proposal: str | None = option(None, "what auto/heuristic draft with (default: auto suffix decoding; "
                                  "heuristic the draft model, n-gram without one)", flag="--proposer",
                                  choices=selectable_proposals)
    p_min: float = option(0.0, "draft model: stop drafting when its top-1 probability falls below this",
                          reads=("draft", "ssd"))
    ngram_min: int = option(2, "prompt lookup: shortest n-gram matched", request=True, reads=("ngram",))
    ngram_max: int = option(4, "prompt lookup: longest n-gram matched", request=True, reads=("ngram",))
    target_threads: int | None = option(None, "target threads for this request (default: the LLM's; "
                                        "ssd: --threads minus the speculator's)", kind=int)
    ssd: SSDOptions = dataclasses.field(default_factory=SSDOptions)
    suffix: SuffixConfig = dataclasses.field(default_factory=SuffixConfig)
    medusa: MedusaOptions = dataclasses.field(default_factory=MedusaOptions)
    cache_scope: str | None = None  # whose suffix cache this request reads and feeds (the server: per API key)
    shared: bool = False  # settings given for several methods (a server's defaults, a bench's base): one a
    # method does not read is not this request's mistake (whoever set them checks them, unused_settings)

    def __post_init__(self) -> None:
        method = get_method(self.method)
        if self.k is None:
            object.__setattr__(self, "k", method.default_k)
        if method.uses_k and (not is_int(self.k) or not 1 <= self.k <= MAX_K):
            raise InvalidRequestError(f"K must be an integer in [1, {MAX_K}] for {self.method}, got {self.k!r}")
        if self.proposal is not None and self.proposal not in selectable_proposals():
            raise InvalidRequestError(f"proposal (--proposer) must be one of {', '.join(selectable_proposals())}, "
                                      f"got {self.proposal!r}")
        if "ngram" in (method.proposal, self.proposal):
            check_ngram_sizes(self.ngram_min, self.ngram_max)
        if not isinstance(self.p_min, (int, float)) or not 0.0 <= self.p_min < 1.0:
            raise InvalidRequestError(f"p_min must be in [0, 1) (--p-min), got {self.p_min!r}")
        if self.target_threads is not None and (not is_int(self.target_threads) or self.target_threads < 1):
            raise InvalidRequestError(f"target_threads must be an integer >= 1, got {self.target_threads!r}")
        for section, cls in SECTIONS.items():
            if not isinstance(getattr(self, section, cls()), cls):
                raise InvalidRequestError(f"{section} must be a {cls.__name__}, got "
                                          f"{type(getattr(self, section)).__name__}")

    def unused_settings(self, proposal: str | None) -> list[Option]:
        """The options set away from their defaults that a request drafting with
        `proposal` (None: plain decoding) never reads: each is a mistake to report
        (a proposal for a method that does not choose one, too)."""
        out = []
        for opt in spec_options():
            holder = self if opt.section is None else getattr(self, opt.section, None)
            value = getattr(holder, opt.name, opt.default)
            if value == opt.default:
                continue
            if opt.reads is not None and proposal not in opt.reads or \
                    opt.name == "proposal" and not get_method(self.method).adaptive:
                out.append(opt)
        return out

    @property
    def effective_k(self) -> int:
        return self.k if get_method(self.method).uses_k else 0

    def with_options(self, **values: Any) -> SpecConfig:
        """A copy with options set by their flat names (`fanout` sets ssd.fanout); validated."""
        top, nested = {}, {s: {} for s in SECTIONS}
        for opt in spec_options():
            if opt.name in values:
                (top if opt.section is None else nested[opt.section])[opt.name] = values.pop(opt.name)
        if values:
            raise InvalidRequestError(f"unknown speculative option(s): {', '.join(sorted(values))}")
        for section, changes in nested.items():
            if changes:
                top[section] = dataclasses.replace(getattr(self, section), **changes)
        return dataclasses.replace(self, **top)


def spec_options() -> list[Option]:
    """Every declared option of SpecConfig and of its method sections (a section's
    options are read by its own proposal alone, unless they say otherwise)."""
    out = list(options_of(SpecConfig))
    for section, cls in SECTIONS.items():
        out.extend(o if o.reads is not None else dataclasses.replace(o, reads=(section,))
                   for o in options_of(cls, section))
    return out



# ---- `proposer`, `proposal`'s deprecated name (it held a PROPOSALS key, not a Proposer) ----
_dataclass_init = SpecConfig.__init__


def _init_accepting_proposer(self: SpecConfig, *args: Any, proposer: str | None = None, **kwargs: Any) -> None:
    if proposer is not None:
        warnings.warn("SpecConfig(proposer=...) is deprecated: pass proposal=... (the same key)",
                      DeprecationWarning, stacklevel=2)
        if kwargs.get("proposal") not in (None, proposer):
            raise InvalidRequestError(f"proposer={proposer!r} (deprecated) and proposal={kwargs['proposal']!r} "
                                      "disagree: pass proposal alone")
        kwargs["proposal"] = proposer
    _dataclass_init(self, *args, **kwargs)


def _read_proposer(self: SpecConfig) -> str | None:
    warnings.warn("SpecConfig.proposer is deprecated: read .proposal", DeprecationWarning, stacklevel=2)
    return self.proposal


SpecConfig.__init__ = _init_accepting_proposer
SpecConfig.proposer = property(_read_proposer)
