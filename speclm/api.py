"""The public Python surface: LLM, SamplingParams, SpecConfig.

    from speclm import LLM, SamplingParams, SpecConfig
    llm = LLM()                                   # embedded Qwen2.5-Coder pair
    out = llm.generate("def fib(n):", SamplingParams(max_new_tokens=64),
                       SpecConfig(method="sd-draft", k=4))
    print(out.text, out.summary.acceptance_rate)
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .backends.base import Backend
from .errors import InvalidRequestError, TokenizerMismatchError
from .metrics import GenerationResult
from .sampling import SamplingParams, is_int
from .speculative.controller import CostModel, GoodputController, HeuristicController, calibrate
from .speculative.loop import Generation
from .speculative.proposers.base import Proposer
from .speculative.proposers.draft_model import DraftModelProposer
from .speculative.proposers.ngram import NgramProposer, check_ngram_sizes
from .speculative.ssd.speculator import FALLBACKS, SSDOptions

METHODS = ("ar", "sd-draft", "sd-ngram", "auto", "heuristic", "ssd")
ADAPTIVE = ("auto", "heuristic")
PROPOSERS = ("draft", "ngram")
MAX_K = 32


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate.

    method: "ar" (plain decoding), "sd-draft" (draft model, fixed K),
    "sd-ngram" (prompt lookup, fixed K), "auto" (K chosen every round from
    measured costs and acceptance, K = 0 when speculation does not pay),
    "heuristic" (K += 2 after a full acceptance, else K -= 1), "ssd"
    (speculative speculative decoding: a speculator process pre-drafts the
    next block for the likely outcomes while the target verifies).
    k: draft tokens per round (for auto/heuristic: the maximum).
    proposer: for auto/heuristic, "draft" or "ngram" (None: draft when the
    LLM has a draft model, else ngram). p_min: the draft model stops drafting
    when its top-1 probability falls below it (0 = never).
    SSD: fanout (pre-drafted branches per round), saguaro_c (Saguaro sampling,
    1 = off), fallback on a cache miss ("auto": cheap once cheap_at_sessions
    requests share the speculator, else neural), ssd_width (branches per
    draft forward: 1 = most likely first, fanout = all in lockstep).
    target_threads: the target's compute threads for this request (None: the
    LLM's; for ssd with a local speculator: the LLM's minus the speculator's).
    """

    method: str = "sd-draft"
    k: int = 4
    ngram_min: int = 2
    ngram_max: int = 4
    proposer: str | None = None
    p_min: float = 0.0
    fanout: int = 8
    saguaro_c: float = 1.0
    fallback: str = "auto"
    target_threads: int | None = None
    ssd_width: int = 1
    cheap_at_sessions: int = 4

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InvalidRequestError(f"unknown method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.method != "ar" and (not is_int(self.k) or not 1 <= self.k <= MAX_K):
            raise InvalidRequestError(f"K must be an integer in [1, {MAX_K}] for {self.method}, got {self.k!r}")
        if self.method == "sd-ngram" or self.proposer == "ngram":
            check_ngram_sizes(self.ngram_min, self.ngram_max)
        if self.proposer is not None and self.proposer not in PROPOSERS:
            raise InvalidRequestError(f"proposer must be one of {', '.join(PROPOSERS)}, got {self.proposer!r}")
        if not isinstance(self.p_min, (int, float)) or not 0.0 <= self.p_min < 1.0:
            raise InvalidRequestError(f"p_min must be in [0, 1) (--p-min), got {self.p_min!r}")
        if not is_int(self.fanout) or not 0 <= self.fanout <= 64:
            raise InvalidRequestError(f"fanout must be an integer in [0, 64] (--fanout), got {self.fanout!r}")
        if not isinstance(self.saguaro_c, (int, float)) or not 0.0 < self.saguaro_c <= 1.0:
            raise InvalidRequestError(f"saguaro_c must be in (0, 1] (--saguaro-c), got {self.saguaro_c!r}")
        if self.fallback not in FALLBACKS:
            raise InvalidRequestError(f"fallback must be one of {', '.join(FALLBACKS)}, got {self.fallback!r}")
        if not is_int(self.ssd_width) or not 1 <= self.ssd_width <= 64:
            raise InvalidRequestError(f"ssd_width must be an integer in [1, 64] (--ssd-width), got {self.ssd_width!r}")
        if not is_int(self.cheap_at_sessions) or self.cheap_at_sessions < 1:
            raise InvalidRequestError(f"cheap_at_sessions must be an integer >= 1, got {self.cheap_at_sessions!r}")
        if self.target_threads is not None and (not is_int(self.target_threads) or self.target_threads < 1):
            raise InvalidRequestError(f"target_threads must be an integer >= 1, got {self.target_threads!r}")

    @property
    def effective_k(self) -> int:
        return 0 if self.method == "ar" else self.k


def load_backend(model: str | Backend, n_ctx: int = 4096, n_threads: int | None = None,
                 max_sequences: int = 4) -> Backend:
    """A Backend from a registered model name, a GGUF path, or a Backend as is."""
    if isinstance(model, Backend):
        return model
    from .backends.llamacpp import LlamaCppBackend
    from .models.store import resolve_model
    return LlamaCppBackend(resolve_model(model), n_ctx=n_ctx, n_threads=n_threads, n_seq_max=max_sequences)


def check_tokenizers(target: Backend, draft: Backend) -> None:
    """Raise TokenizerMismatchError unless every id both vocabularies hold
    decodes to the same bytes (ids beyond the shared range never match the
    target and are simply rejected)."""
    shared = min(target.vocab_size, draft.vocab_size)
    if shared < 0.9 * max(target.vocab_size, draft.vocab_size):
        raise TokenizerMismatchError(
            f"draft {draft.name} has {draft.vocab_size} tokens, target {target.name} has "
            f"{target.vocab_size}: they are different tokenizers; pick a draft from the target's family")
    for tid in range(shared):
        a, b = target.token_bytes(tid), draft.token_bytes(tid)
        if a != b:
            raise TokenizerMismatchError(
                f"draft {draft.name} and target {target.name} disagree on token id {tid} "
                f"({b!r} vs {a!r}): they use different tokenizers; pick a draft from the target's family")


class LLM:
    """A target model and (lazily) a draft model, generating losslessly."""

    def __init__(self, target: str | Backend | None = None, draft: str | Backend | None = None,
                 n_ctx: int = 4096, n_threads: int | None = None, max_sequences: int = 2,
                 speculator=None):
        """n_ctx: tokens per sequence; max_sequences: requests in flight at once;
        speculator: a SpeculatorConfig for method ssd (None: defaults)."""
        from .models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
        self._n_ctx, self._n_threads, self._max_seqs = n_ctx, n_threads, max_sequences
        self.target = load_backend(target or DEFAULT_TARGET, n_ctx, n_threads, max_sequences)
        self._draft_spec = draft if draft is not None else (DEFAULT_DRAFT if target is None else None)
        self._draft: Backend | None = None
        self._draft_lock = threading.Lock()
        self._costs: dict[str | None, CostModel] = {}
        self._speculator_cfg = speculator
        self._speculator = None

    @property
    def draft(self) -> Backend:
        """The draft backend, loaded and checked against the target on first use."""
        with self._draft_lock:  # two first sd-draft requests from two threads load it once
            return self._load_draft()

    def _load_draft(self) -> Backend:
        if self._draft is None:
            if self._draft_spec is None:
                raise InvalidRequestError("method sd-draft needs a draft model: pass draft=NAME|PATH (--draft)")
            backend = load_backend(self._draft_spec, self._n_ctx, self._n_threads, self._max_seqs)
            check_tokenizers(self.target, backend)
            self._draft = backend
        return self._draft

    def proposer_kind(self, spec: SpecConfig) -> str | None:
        """"draft", "ngram" or None (plain decoding) for this spec."""
        if spec.method in ("sd-draft", "ssd"):
            return "draft"
        if spec.method == "sd-ngram":
            return "ngram"
        if spec.method in ADAPTIVE:
            return spec.proposer or ("draft" if self._draft_spec is not None else "ngram")
        return None

    def speculator(self):
        """The SSD speculator process (spawned, or connected, on first use)."""
        from .speculative.ssd.client import SpeculatorConfig, SpeculatorProcess
        from .speculative.ssd.worker import model_spec
        with self._draft_lock:
            if self._speculator is None:
                draft = self._load_draft()  # checks the tokenizers; also the fallback if the speculator dies
                cfg = dataclasses.replace(self._speculator_cfg or SpeculatorConfig(), n_ctx=self._n_ctx)
                self._speculator = SpeculatorProcess(model_spec(self._draft_spec, draft), cfg)
            return self._speculator

    def target_threads(self, spec: SpecConfig) -> int | None:
        """The target's threads for a request: the spec's, or for ssd with a local
        speculator the LLM's threads minus the speculator's (at least 1)."""
        if spec.target_threads is not None or spec.method != "ssd":
            return spec.target_threads
        cfg = self.speculator().cfg
        base = getattr(self.target, "n_threads", None)
        if cfg.addr is not None or base is None:
            return None
        return max(1, base - (cfg.threads or 1))

    def proposer(self, spec: SpecConfig) -> Proposer | None:
        if spec.method == "ssd":
            from .speculative.ssd.client import SSDProposer
            opts = SSDOptions(k=spec.k, fanout=spec.fanout, saguaro_c=spec.saguaro_c, fallback=spec.fallback,
                              width=spec.ssd_width, cheap_at_sessions=spec.cheap_at_sessions)
            return SSDProposer(self.speculator().open, opts, fallback=lambda: DraftModelProposer(self.draft),
                               name=f"ssd:{self.draft.name}")
        kind = self.proposer_kind(spec)
        if kind == "draft":
            return DraftModelProposer(self.draft, p_min=spec.p_min)
        if kind == "ngram":
            return NgramProposer(spec.ngram_min, spec.ngram_max)
        return None

    def cost_model(self, spec: SpecConfig) -> CostModel:
        """Measured costs for this LLM and proposer kind, calibrated on first use
        and then learnt from every round run (shared by all requests)."""
        kind = self.proposer_kind(spec)
        if kind not in self._costs:
            self._costs[kind] = calibrate(self.target, self.draft if kind == "draft" else None,
                                          max_block=min(spec.k, 16) + 1)
        return self._costs[kind]

    def controller(self, spec: SpecConfig):
        if spec.method == "auto":
            return GoodputController(self.cost_model(spec), k_max=spec.k)
        if spec.method == "heuristic":
            return HeuristicController(k_init=min(spec.k, 4), k_max=spec.k)
        return None

    def start(self, prompt_ids: list[int], params: SamplingParams, spec: SpecConfig,
              on_text: Callable[[str], None] | None = None) -> Generation:
        """A Generation for one request (the scheduler or `generate` steps it)."""
        return Generation(self.target, self.proposer(spec), prompt_ids, params, spec.effective_k,
                          method=spec.method, on_text=on_text, controller=self.controller(spec),
                          threads=self.target_threads(spec))

    def encode(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        """Token ids for a text prompt (or a sequence of ids, passed through)."""
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return [int(t) if isinstance(t, np.integer) else t for t in prompt]
        if not isinstance(prompt, str):
            raise InvalidRequestError(
                f"prompt must be a str or a sequence of token ids, got {type(prompt).__name__}")
        if not prompt.strip():
            raise InvalidRequestError("the prompt is empty: give some text to continue")
        if chat:
            text = self.target.apply_chat_template([{"role": "user", "content": prompt}])
            return self.target.tokenize(text, add_special=False)
        return self.target.tokenize(prompt, add_special=True)

    def generate(self, prompt: str | list[int], params: SamplingParams | None = None,
                 spec: SpecConfig | None = None, chat: bool = False,
                 on_text: Callable[[str], None] | None = None) -> GenerationResult:
        """Generate a continuation of prompt (text or token ids).

        spec None: method auto (over the draft model if the LLM has one, else
        prompt lookup), which falls back to plain decoding when speculation
        does not pay."""
        params = params or SamplingParams()
        spec = spec or SpecConfig(method="auto")
        gen = self.start(self.encode(prompt, chat), params, spec, on_text)
        return gen.run()

    def warmup(self, spec: SpecConfig | None = None) -> None:
        """Run one tiny forward on each model a method uses, so the first timed
        request does not pay for page faults of a freshly mapped file."""
        backends = [self.target] + ([self.draft] if spec and self.proposer_kind(spec) == "draft" else [])
        for backend in backends:
            seq = backend.new_sequence()
            try:
                backend.score(seq, [0, 0])
            finally:
                backend.free(seq)
        if spec is not None and spec.method == "auto":
            self.cost_model(spec)  # calibrate now, not inside the first timed request

    def close_speculator(self) -> None:
        """Shut the SSD speculator process down (a later ssd request starts a new one)."""
        with self._draft_lock:
            if self._speculator is not None:
                self._speculator.close()
                self._speculator = None

    def close(self) -> None:
        self.close_speculator()
        self.target.close()
        if self._draft is not None:
            self._draft.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
