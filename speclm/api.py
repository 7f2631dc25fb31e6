"""The public Python surface: LLM, SamplingParams, SpecConfig.

    from speclm import LLM, SamplingParams, SpecConfig
    llm = LLM()                                   # embedded Qwen2.5-Coder pair
    out = llm.generate("def fib(n):", SamplingParams(max_new_tokens=64),
                       SpecConfig(method="sd-ngram", k=4))
    print(out.text, out.summary.acceptance_rate)

What a method drafts with, how K is chosen and how many threads the target
keeps come from the method table (`speclm.speculative.methods`); the LLM owns
the resources those records use: the models, the SSD speculator and the
measured cost models.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

import numpy as np

from .backends.base import KV_SEQUENCES, N_CTX, Backend
from .backends.kernels import check_request as check_kernels
from .backends.load import check_tokenizers, load_backend  # noqa: F401  (public here too)
from .backends.probe import WORKS
from .errors import BusyError, InvalidRequestError
from .metrics import GenerationResult
from .prefix_cache import PrefixCache
from .sampling import SamplingParams
from .speculative.config import MAX_K, SpecConfig  # noqa: F401  (public here)
from .costs import TIMED_K, CostModel, calibrate
from .speculative.controller import Calibration
from .speculative.loop import Generation
from .speculative.steps import run_alone
from .speculative.methods import METHODS, PROPOSALS, get_method  # noqa: F401  (METHODS: the table)
from .speculative.proposers.suffix_index import SUFFIX_CACHE_TOKENS, SuffixCache


class LLM:
    """A target model and (lazily) a draft model, generating losslessly."""

    def __init__(self, target: str | Backend | None = None, draft: str | Backend | None = None,
                 n_ctx: int = N_CTX, n_threads: int | None = None, max_sequences: int = KV_SEQUENCES,
                 speculator=None, suffix_cache_tokens: int = SUFFIX_CACHE_TOKENS, heads=None,
                 prefix_cache_tokens: int = 0, kernels: str | None = None,
                 kernels_for: str = "speculation"):
        """n_ctx: tokens per sequence; max_sequences: requests in flight at once;
        speculator: a SpeculatorConfig for method ssd (None: defaults);
        suffix_cache_tokens: bound of each suffix cache of earlier outputs (0: none);
        prefix_cache_tokens: bound of the finished requests' KV copies a later prompt with
        the same start reuses (0: off, so each request's numerics are its own);
        heads: MedusaHeads for method medusa (None: loaded from the heads file on first use);
        kernels: llama.cpp kernels for every model (None: $SPECLM_KERNELS, else auto: each
        configuration proven on this machine first, the fastest for `kernels_for`,
        "speculation", "decoding" or "serving" max_sequences concurrent requests, taken;
        docs/kernels.md)."""
        from .models.registry import DEFAULT_TARGET, default_draft
        if kernels_for not in WORKS:
            raise InvalidRequestError(f"kernels_for must be one of {', '.join(WORKS)}, got {kernels_for!r}")
        self._n_ctx, self._n_threads, self._max_seqs = n_ctx, n_threads, max_sequences
        self._kernels = check_kernels(kernels)
        self.target = load_backend(target or DEFAULT_TARGET, n_ctx, n_threads, max_sequences, self._kernels,
                                   kernels_for)
        self._draft_spec = draft if draft is not None else \
            (default_draft(target) if target is None or isinstance(target, str) else None)
        self._draft: Backend | None = None
        self._draft_lock = threading.Lock()
        self._measured: dict[str | None, CostModel] = {}  # proposal -> the costs timed on this machine
        self._costs: dict[tuple[str | None, str | None], CostModel] = {}  # (proposal, scope) -> learning copy
        self._calibrations: dict[tuple[str | None, str | None], Calibration] = {}  # (proposal, scope)
        SuffixCache(suffix_cache_tokens)  # validate now, not at the first suffix request
        self._suffix_tokens = suffix_cache_tokens
        self._suffix_caches: dict[str | None, SuffixCache] = {}
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens else None
        if self.prefix_cache is not None and not self.target.can_copy_kv:
            raise InvalidRequestError(f"{self.target.name} cannot copy KV, so it has no prefix cache: "
                                      f"pass prefix_cache_tokens=0 (--prefix-cache-tokens 0)")
        self._cache_lock = threading.Lock()
        self._speculator_cfg = speculator
        self._heads: dict[str | None, object] = {} if heads is None else {None: heads}  # heads file -> MedusaHeads
        self._learners: dict[tuple, object] = {}  # (heads file, scope) -> OnlineLearner
        self._speculator = None  # a SpeculatorSupervisor once an ssd request ran
        self._speculator_lock = threading.Lock()
        # Held by whoever runs forwards on target or draft: llama.cpp contexts are not
        # thread-safe (the Engine's thread steps requests; calibration may come from another).
        self.backend_lock = threading.RLock()
        self._costs_lock = threading.Lock()

    @property
    def draft(self) -> Backend:
        """The draft backend, loaded and checked against the target on first use."""
        with self._draft_lock:  # two first sd-draft requests from two threads load it once
            return self._load_draft()

    def _load_draft(self) -> Backend:
        if self._draft is None:
            if self._draft_spec is None:
                raise InvalidRequestError("no draft model: this LLM needs a draft model for that: "
                                          "pass draft=NAME|PATH (--draft)")
            backend = load_backend(self._draft_spec, self._n_ctx, self._n_threads, self._max_seqs, self._kernels,
                                   "decoding")
            check_tokenizers(self.target, backend)
            self._draft = backend
        return self._draft

    @property
    def has_draft(self) -> bool:
        """Whether a draft model is configured (it loads on first use)."""
        return self._draft_spec is not None

    @staticmethod
    def _needs_draft(proposal: str | None) -> bool:
        return proposal is not None and PROPOSALS[proposal].needs_draft

    def proposal_of(self, spec: SpecConfig) -> str | None:
        """The PROPOSALS key this request drafts with (None: plain decoding)."""
        return get_method(spec.method).proposal_for(spec, self.has_draft)

    def suffix_cache(self, scope: str | None = None) -> SuffixCache | None:
        """The cache of earlier prompts and verified outputs that suffix decoding drafts
        from, one per scope (None: the LLM's own); None when disabled (size 0)."""
        if self._suffix_tokens == 0:
            return None
        with self._cache_lock:
            if scope not in self._suffix_caches:
                self._suffix_caches[scope] = SuffixCache(self._suffix_tokens)
            return self._suffix_caches[scope]

    def suffix_cache_stats(self) -> dict[str | None, dict]:
        """SuffixCache.stats() of every scope that has a cache."""
        with self._cache_lock:
            caches = dict(self._suffix_caches)
        return {scope: cache.stats() for scope, cache in caches.items()}

    def clear_suffix_cache(self, scope: str | None = None) -> None:
        """Forget what suffix decoding learnt in `scope` (its acceptance calibration stays)."""
        with self._cache_lock:
            cache = self._suffix_caches.get(scope)
        if cache is not None:
            cache.clear()

    def prefix_cache_stats(self) -> dict[str | None, dict]:
        """PrefixCache.stats() per scope ({} when the prefix cache is off)."""
        return self.prefix_cache.stats() if self.prefix_cache is not None else {}

    def clear_prefix_cache(self, scope: str | None = None) -> int:
        """Forget the KV copies kept for `scope`; returns how many there were."""
        return self.prefix_cache.clear(scope) if self.prefix_cache is not None else 0

    def medusa_heads(self, spec: SpecConfig):
        """(MedusaHeads, OnlineLearner or None) for a medusa request: the heads file's
        heads, or with spec.medusa.online this scope's own adapting copy of them."""
        from .heads.online import OnlineLearner
        opts = spec.medusa
        with self._cache_lock:
            self.target.enable_hidden()
            if opts.heads not in self._heads:
                self._heads[opts.heads] = self._load_heads(opts.heads)
            heads = self._heads[opts.heads]
            if not opts.online:
                return heads, None
            key = (opts.heads, spec.cache_scope)
            if key not in self._learners:
                self._learners[key] = OnlineLearner(heads.copy(), lr=opts.online_lr, budget_ms=opts.online_budget_ms)
            return self._learners[key].heads, self._learners[key]

    def _load_heads(self, path: str | None):
        from pathlib import Path

        from .heads.file import find_heads, load_heads, target_sha256
        gguf = self.target.path
        if gguf is None:
            raise InvalidRequestError(f"no medusa heads for {self.target.name}: pass LLM(heads=MedusaHeads(...))")
        sha = target_sha256(gguf)
        found = Path(path) if path is not None else find_heads(sha)
        if found is None:
            raise InvalidRequestError(f"no medusa heads trained for {Path(gguf).name}: train them with "
                                      f"`speclm heads train --target NAME` or pass --heads FILE")
        return load_heads(found, gguf, self.target.enable_hidden(), self.target.vocab_size, sha)

    def clear_heads(self, scope: str | None = None) -> None:
        """Forget what online adaptation learnt in `scope` (the next request starts from the file's heads)."""
        with self._cache_lock:
            for key in [k for k in self._learners if k[1] == scope]:
                del self._learners[key]

    def calibration(self, proposal: str | None, scope: str | None = None) -> Calibration:
        """How a proposal's per-token estimates map to observed acceptance, learnt by the
        requests of one cache scope (SpecConfig.cache_scope): the K a tenant's request
        drafts, and so its timing, never reflects another tenant's traffic."""
        with self._cache_lock:
            return self._calibrations.setdefault((proposal, scope), Calibration())

    def forget_learnt(self, scope: str | None = None) -> None:
        """Forget the acceptance calibrations and cost-model updates learnt in `scope`
        (its next request starts from the costs measured on this machine)."""
        with self._cache_lock, self._costs_lock:
            for table in (self._calibrations, self._costs):
                for key in [key for key in table if key[1] == scope]:
                    del table[key]

    def _proposal_checked(self, spec: SpecConfig) -> str | None:
        """proposal_of(spec), refusing a method that needs a draft model this LLM lacks
        and settings the request's drafting would ignore."""
        proposal = self.proposal_of(spec)
        if self._needs_draft(proposal) and not self.has_draft:
            raise InvalidRequestError(f"method {spec.method} needs a draft model: pass draft=NAME|PATH (--draft)")
        if not spec.shared and (unused := [_setting_name(o) for o in spec.unused_settings(proposal)]):
            raise InvalidRequestError(
                f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not read by method {spec.method} "
                f"(it drafts with {proposal or 'nothing: plain decoding'}): drop "
                f"{'it' if len(unused) == 1 else 'them'} or choose a method that reads "
                f"{'it' if len(unused) == 1 else 'them'} (speclm.speculative.methods lists the methods)")
        return proposal

    def speculator(self):
        """The SSD speculator process (spawned, or connected, on first use; a lost one
        is restarted here, with backoff: speculative/ssd/supervisor.py)."""
        from .speculative.ssd.client import SpeculatorConfig
        from .speculative.ssd.supervisor import SpeculatorSupervisor
        from .speculative.ssd.worker import model_spec
        with self._speculator_lock:
            if self._speculator is None:
                draft = self.draft  # checks the tokenizers; also the fallback if the speculator dies
                cfg = (self._speculator_cfg or SpeculatorConfig()).sized(self._n_ctx, self._max_seqs)
                if cfg.kernels is None:
                    cfg = dataclasses.replace(cfg, kernels=self._kernels)
                self._speculator = SpeculatorSupervisor(model_spec(self._draft_spec, draft), cfg)
            return self._speculator.get()

    def speculator_state(self) -> dict | None:
        """{"state": "alive" | "lost", "restarts", "pid", "reason"}; None before any ssd request."""
        supervisor = self._speculator
        return None if supervisor is None else supervisor.state()

    def cost_model(self, proposal: str | None, k: int, scope: str | None = None) -> CostModel:
        """Costs for this proposal as the requests of `scope` (SpecConfig.cache_scope) learn
        them from their rounds, starting from the ones measured on this machine
        (`measure_costs`: on first use, blocks up to min(k, TIMED_K) + 1). proposal None: the
        target's forwards alone (the batching engine's curve)."""
        base = self.measure_costs(proposal, k)
        with self._costs_lock:
            if (proposal, scope) not in self._costs:
                self._costs[(proposal, scope)] = base.copy()
            return self._costs[(proposal, scope)]

    def _known_curve(self) -> dict[int, float] | None:
        """The target's v(b) already timed on this machine for this file and thread count:
        the kernel probe's curve of the configuration it was loaded with (None: time it)."""
        choice = self.target.kernel_choice
        return choice.curve(self.target.n_threads) if choice is not None else None

    def measure_costs(self, proposal: str | None, k: int = MAX_K) -> CostModel:
        """The costs `proposal` starts from, once per LLM and proposal: the target's v(b) from
        the kernel probe's curve for this file, machine and thread count where it has one
        (`_known_curve`), else timed for blocks of up to min(k, TIMED_K) + 1 tokens; and the
        draft's step when `proposal` drafts with the draft model. Later calls return that
        (never updated: each scope learns on its own copy, `cost_model`).
        Timing takes a free KV sequence under backend_lock, so it never runs alongside
        another thread's forwards; BusyError when every sequence of a model it must time
        is held by requests (a server measures every proposal it may use before it takes any)."""
        with self._costs_lock:
            if proposal not in self._measured:
                draft = self.draft if self._needs_draft(proposal) else None
                known = self._known_curve()
                with self.backend_lock:
                    for backend in (self.target if known is None else None, draft):  # the ones timed now
                        if backend is not None and backend.max_sequences is not None \
                                and backend.live_sequences >= backend.max_sequences:
                            raise BusyError(f"all {backend.max_sequences} KV sequences of {backend.name} are in "
                                            f"use, and measuring the costs of {proposal or 'decoding'} needs one: "
                                            "retry when a request has finished")
                    self._measured[proposal] = calibrate(self.target, draft, max_block=min(k, TIMED_K) + 1,
                                                         known=known)
            return self._measured[proposal]

    def start(self, prompt_ids: list[int], params: SamplingParams, spec: SpecConfig,
              on_text: Callable[[str], None] | None = None,
              prediction: str | Sequence[int] | None = None) -> Generation:
        """A Generation for one request (the scheduler or `generate` steps it).
        prediction: the output the client expects (Predicted Outputs), a draft source
        for the methods whose proposal reads one; InvalidRequestError for the others."""
        method = get_method(spec.method)
        proposal = self._proposal_checked(spec)
        predicted = self.prediction_ids(prediction, proposal, spec)
        controller = method.controller(self, spec) if method.controller is not None and proposal else None
        proposer = PROPOSALS[proposal].make(self, spec) if proposal is not None else None
        if predicted is not None:
            proposer.predict(predicted, self.target.token_bytes)
        return Generation(self.target, proposer, prompt_ids, params, spec.effective_k,
                          method=spec.method, on_text=on_text, controller=controller,
                          threads=method.threads(self, spec), prefix_cache=self.prefix_cache,
                          cache_scope=spec.cache_scope, prediction=predicted)

    def prediction_ids(self, prediction: str | Sequence[int] | None, proposal: str | None,
                       spec: SpecConfig) -> list[int] | None:
        """The prediction's token ids (text tokenized without BOS), checked against what
        the request's method drafts with; None for no prediction."""
        if prediction is None:
            return None
        if proposal is None or not PROPOSALS[proposal].predicts:
            readers = [name for name, m in METHODS.items() if m.proposal_for(spec, self.has_draft) is not None
                       and PROPOSALS[m.proposal_for(spec, self.has_draft)].predicts]
            raise InvalidRequestError(f"prediction is not read by method {spec.method} (it drafts with "
                                      f"{proposal or 'nothing: plain decoding'}): drop it or use one of "
                                      f"{', '.join(readers)}")
        if isinstance(prediction, str):
            ids = self.target.tokenize(prediction, add_special=False, special=False) if prediction else []
        else:
            ids = [int(t) if isinstance(t, np.integer) else t for t in prediction]
            if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.target.vocab_size for t in ids):
                raise InvalidRequestError(f"prediction token ids must be integers in [0, {self.target.vocab_size})")
        if len(ids) > self.target.n_ctx:
            raise InvalidRequestError(f"prediction is {len(ids)} tokens, more than the {self.target.n_ctx}-token "
                                      "context holds: send only the output you expect")
        return ids

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
            return self.target.tokenize_chat([{"role": "user", "content": prompt}])  # content stays text
        return self.target.tokenize(prompt, add_special=True)

    def generate(self, prompt: str | list[int], params: SamplingParams | None = None,
                 spec: SpecConfig | None = None, chat: bool = False,
                 on_text: Callable[[str], None] | None = None,
                 prediction: str | Sequence[int] | None = None) -> GenerationResult:
        """Generate a continuation of prompt (text or token ids).

        spec None: SpecConfig() (method auto, over the draft model if the LLM
        has one, else prompt lookup), which falls back to plain decoding when
        speculation does not pay. prediction: the output expected (text or ids), a
        draft source that changes speed, never the output (`start`)."""
        params = params or SamplingParams()
        spec = spec or SpecConfig()
        gen = self.start(self.encode(prompt, chat), params, spec, on_text, prediction)
        with self.backend_lock:
            return run_alone(gen)

    def warmup(self, spec: SpecConfig | None = None) -> None:
        """Run one tiny forward on each model a method uses, so the first timed
        request does not pay for page faults of a freshly mapped file."""
        proposal = self._proposal_checked(spec) if spec is not None else None
        backends = [self.target] + ([self.draft] if self._needs_draft(proposal) else [])
        for backend in backends:
            with self.backend_lock:
                seq = backend.new_sequence()
                try:
                    backend.score(seq, [0, 0])
                finally:
                    backend.free(seq)
        if spec is not None and get_method(spec.method).controller is not None and proposal is not None:
            self.measure_costs(proposal, spec.k)  # now, not inside the first timed request

    def close_speculator(self) -> None:
        """Shut the SSD speculator process down (a later ssd request starts a new one)."""
        with self._speculator_lock:
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


def _setting_name(opt) -> str:
    """A SpecConfig option as a library user names it (`with_options`' flat name), with its
    command-line flag beside it where that is another word (`proposal (--proposer)`)."""
    name = opt.dest.replace(".", "_")
    return name if opt.flag == "--" + name.replace("_", "-") else f"{name} ({opt.flag})"
