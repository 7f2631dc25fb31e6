"""SSD's own settings (`SpecConfig.ssd`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InvalidRequestError
from ...sampling import is_int
from ...options import option

FALLBACKS = ("auto", "neural", "cheap")


@dataclass(frozen=True)
class SSDOptions:
    """Per-request SSD settings (the block length is SpecConfig.k).

    fanout: total pre-drafted branches per round (B); r: fan-out exponent
    (F_k ∝ P(k)^(1/(1+r))); saguaro_c / saguaro_top: Saguaro sampling (c = 1
    disables); fallback on a miss: "neural" (draft synchronously), "cheap"
    (n-gram, one-hot q; empty block if no match) or "auto" (neural while fewer
    than cheap_at_sessions sessions are live). width: branches advanced per
    draft forward, most likely outcome first (1: depth-first, best when one
    forward costs about its batch size, as on CPUs; fanout: every branch in
    lockstep, as one batch, best on GPUs).
    """

    fanout: int = option(8, "pre-drafted branches per round", request=True)
    saguaro_c: float = option(1.0, "Saguaro sampling: scale the draft's top-3 mass by C in (0, 1] (1 = off)",
                              request=True)
    fallback: str = option("auto", "on a cache miss: draft now (neural), n-gram (cheap), or by load (auto)",
                           choices=FALLBACKS)
    width: int = option(1, "branches advanced per draft forward: 1 = most likely first, "
                           "= --fanout: all branches in lockstep, one batch", flag="--ssd-width")
    cheap_at_sessions: int = option(4, "--fallback auto: n-gram fallback once this many requests share "
                                       "the speculator")
    r: float = option(1.0, "fan-out exponent", cli=False)
    saguaro_top: int = option(3, "Saguaro sampling: how many top tokens are scaled", cli=False)
    alpha_prior: float = option(0.7, "prior acceptance before any round is seen", cli=False)

    def __post_init__(self) -> None:
        if not is_int(self.fanout) or not 0 <= self.fanout <= 64:
            raise InvalidRequestError(f"fanout must be an integer in [0, 64] (--fanout), got {self.fanout!r}")
        if not isinstance(self.saguaro_c, (int, float)) or not 0.0 < self.saguaro_c <= 1.0:
            raise InvalidRequestError(f"saguaro_c must be in (0, 1] (--saguaro-c), got {self.saguaro_c!r}")
        if self.fallback not in FALLBACKS:
            raise InvalidRequestError(f"fallback must be one of {', '.join(FALLBACKS)}, got {self.fallback!r}")
        if not is_int(self.width) or not 1 <= self.width <= 64:
            raise InvalidRequestError(f"width must be an integer in [1, 64] (--ssd-width), got {self.width!r}")
        if not is_int(self.cheap_at_sessions) or self.cheap_at_sessions < 1:
            raise InvalidRequestError(f"cheap_at_sessions must be an integer >= 1 (--cheap-at-sessions), "
                                      f"got {self.cheap_at_sessions!r}")

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}
