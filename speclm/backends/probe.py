"""Prove a kernel configuration on this machine before a model is loaded with it.

Each configuration runs in a child process (`python -m speclm.backends.probe`)
that loads the model with it, scores blocks of PROBE_BLOCKS tokens and writes
their logits; a child that dies by a signal, outlives PROBE_TIMEOUT_S or writes
logits that disagree with the plain kernels' marks the configuration unusable
for that model on this machine. A configuration that fails on the small model
is not tried on a larger one. The children of usable configurations also time
v(b) for TIMED_BLOCKS with the controller's own `calibrate`. Verdicts are
cached in the speclm cache directory under a key of the CPU and the llama.cpp
build (a rebuilt llama-cpp-python or another CPU probes again), the model
file and the thread count. The chosen configuration's curve also seeds the
costs a speculating LLM starts from (`KernelChoice.curve`). docs/kernels.md
explains the rules.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import native
from ..errors import BackendError, InvalidRequestError, ModelError, SpeclmError, TokenizerMismatchError
from ..machine import busy_cpus, busy_warning, cpu_flags, cpu_model
from . import kernels as K

PROBE_VERSION = 6  # 2: v(32) and v(64) timed too; 3: a prompt's prefill too; 4: speclm-repack holds the 32-value formats in X16; 5: and Q4_K, Q6_K; 6: speclm's threads split a matmul in longer runs (older verdicts: probed again)
PROBE_BLOCKS = (1, 2, 3, 8, 16)  # the forwards whose logits are checked
# v(b) measured for each usable configuration: one stream's blocks up to 16, and a server's
# steps (16 streams with 2 or 4 rows each), which per row cost less than 16 rows (docs/kernels.md)
TIMED_BLOCKS = (1, 2, 4, 8, 16, 32, 64)
PROBE_CONTEXT = 64  # tokens in the KV before the timed blocks
PREFILL_TOKENS = 256  # the prompt whose prefill is timed: one chunk past 64 rows, which v(b) never prices
PROMPT_PER_TOKEN = 1.0  # prompt tokens a score counts per generated token (docs/kernels.md#the-choice)
PROBE_TIMEOUT_S = 180.0  # $SPECLM_PROBE_TIMEOUT overrides
LOGIT_TOLERANCE = 1.5  # max |Δ logit| against the plain kernels (measured between sound paths: 0.3-0.5)
MARGIN_FOR_TOP1 = 2 * LOGIT_TOLERANCE  # top-1 must agree where the reference leads by more than this
FAULT_ENV = "SPECLM_PROBE_FAULT"  # test hook: "CONFIG_OR_FAMILY:segv|hang|wrong[,...]"
SMALL_MODEL = "smollm2-135m"
MODEL_UNUSABLE = 3  # a child's exit status when the model itself cannot be loaded (any kernels)
SPECULATION_ALPHAS = (0.6, 0.8, 0.9, 0.95, 0.98)  # acceptance rates a speculation score averages over
TIE = 0.10  # a configuration must score this much better than an earlier one in build order to win:
# two probes of configurations that run the same kernels differed by up to 9 % (docs/kernels.md)
_TEXT = ("def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n"
         "        mid = (lo + hi) // 2\n        if items[mid] == target:\n            return mid\n"
         "        if items[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n"
         "    return -1\n\n\nclass Stack:\n    def __init__(self):\n        self.items = []\n")


@dataclass
class Verdict:
    """What one configuration did with one model on this machine."""

    config: str
    status: str  # ok | crashed | hung | wrong | failed | skipped
    detail: str = ""
    v_ms: dict[int, float] = field(default_factory=dict)  # median ms per block size (usable ones)
    threads: int | None = None
    probed_at: str = ""
    prefill_ms: float | None = None  # ms to prefill PREFILL_TOKENS tokens (usable ones)

    @property
    def usable(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        return self.status + (f" ({self.detail})" if self.detail else "")

    @classmethod
    def from_dict(cls, d: dict) -> Verdict:
        return cls(**{**d, "v_ms": {int(k): float(v) for k, v in d.get("v_ms", {}).items()}})


@dataclass(frozen=True)
class KernelChoice:
    """The configuration a model was loaded with, and why (shown by generate, /health, bench)."""

    config: K.KernelConfig
    request: str
    reason: str
    verdicts: dict[str, Verdict]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def v_ms(self) -> dict[int, float]:
        return self.verdicts[self.name].v_ms if self.name in self.verdicts else {}

    @property
    def prefill_ms(self) -> float | None:
        return self.verdicts[self.name].prefill_ms if self.name in self.verdicts else None

    def curve(self, threads: int) -> dict[int, float] | None:
        """The chosen configuration's v(b) as the probe timed it (costs.calibrate's way: min
        of 2 after PROBE_CONTEXT tokens), if timed with `threads` threads; else None."""
        verdict = self.verdicts.get(self.name)
        return dict(verdict.v_ms) if verdict is not None and verdict.v_ms and verdict.threads == threads else None

    def to_dict(self) -> dict:
        return {"kernels": self.name, "request": self.request, "reason": self.reason,
                "verdicts": {n: v.describe() for n, v in self.verdicts.items()},
                "v_ms": {str(b): round(ms, 1) for b, ms in self.v_ms.items()}}


# ---- the cache ------------------------------------------------------------------------
def machine_key() -> str:
    """The CPU and the llama.cpp build: verdicts hold for this key only."""
    import llama_cpp
    lib = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in lib.glob("*.so*") if p.is_file()) \
        if lib.is_dir() else []
    ours = native.library_path()
    libs += [(ours.name, ours.stat().st_size, ours.stat().st_mtime_ns)] if ours is not None else []
    facts = {"cpu": cpu_model(), "flags": cpu_flags(), "llama_cpp": getattr(llama_cpp, "__version__", None),
             "libs": libs, "system_info": K.build_info().system_info, "probe": PROBE_VERSION}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def file_key(path: Path) -> str:
    """The file by its content (its size, first 4 MiB and last 1 MiB: the header, the
    tensor types and the head), so a copy shares its verdicts and a re-quantisation does not."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        h.update(fh.read(4 << 20))
        fh.seek(max(0, size - (1 << 20)))
        h.update(fh.read())
    return f"{path.name}|{h.hexdigest()[:16]}"


def model_key(path: Path, threads: int) -> str:
    """The file and the thread count, which the timings (and a crash that needs threads) depend on."""
    return f"{file_key(path)}|{threads} threads"


def cache_path() -> Path:
    """$SPECLM_KERNELS_CACHE, else kernels.json in the speclm cache directory."""
    env = os.environ.get("SPECLM_KERNELS_CACHE")
    if env:
        return Path(env).expanduser()
    from ..models.store import cache_dir
    return cache_dir() / "kernels.json"


@contextmanager
def _locked_cache():
    """The verdict file, read under an exclusive lock (two processes probe one at a time)."""
    path = cache_path()
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):
            data = {}
        yield data
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)


def cached_verdicts(path: Path, threads: int) -> dict[str, Verdict]:
    """The verdicts on record for this model on this machine and build at `threads` threads."""
    with _locked_cache() as data:
        entry = data.get(machine_key(), {}).get("models", {}).get(model_key(path, threads), {})
    return {n: Verdict.from_dict(v) for n, v in entry.items()}


def forget(path: Path | None = None) -> None:
    """Drop this machine's verdicts (for one model at every thread count, or all): the next
    load probes again."""
    with _locked_cache() as data:
        machine = data.get(machine_key())
        if machine is not None:
            if path is None:
                machine["models"] = {}
            else:
                mine = file_key(path) + "|"
                machine["models"] = {k: v for k, v in machine.get("models", {}).items() if not k.startswith(mine)}


def _record(path: Path, threads: int, verdicts: dict[str, Verdict]) -> None:
    with _locked_cache() as data:
        machine = data.setdefault(machine_key(), {"cpu": cpu_model(), "system_info": K.build_info().system_info,
                                                  "models": {}})
        machine["models"].setdefault(model_key(path, threads), {}).update({n: asdict(v) for n, v in verdicts.items()})


# ---- probing ----------------------------------------------------------------------------
def _timeout() -> float:
    try:
        return float(os.environ.get("SPECLM_PROBE_TIMEOUT", PROBE_TIMEOUT_S))
    except ValueError:
        raise InvalidRequestError("SPECLM_PROBE_TIMEOUT must be a number of seconds") from None


def _run_child(config: K.KernelConfig, path: Path, out: Path, threads: int, timed: bool) -> Verdict:
    cmd = [sys.executable, "-m", "speclm.backends.probe", "--config", config.name, "--model", str(path),
           "--out", str(out), "--threads", str(threads)] + (["--time"] if timed else [])
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    limit = _timeout()
    env = {k: v for k, v in os.environ.items() if k != K.TILED_ENV}  # the child sets its configuration's
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        return Verdict(config.name, "hung", f"no answer within {limit:.0f} s", probed_at=now)
    if proc.returncode == MODEL_UNUSABLE:  # the file, not the kernels: the same error as a load here
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        kinds = {e.__name__: e for e in (BackendError, InvalidRequestError, ModelError, TokenizerMismatchError)}
        raise kinds.get(found["type"], ModelError)(found["message"])
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return Verdict(config.name, "crashed", f"killed by {name}", probed_at=now)
    if proc.returncode != 0:
        last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "no message")
        return Verdict(config.name, "failed", f"exit {proc.returncode}: {last[:200]}", probed_at=now)
    v_ms = json.loads((out / "v_ms.json").read_text()) if timed else {}
    prefill = json.loads((out / "prefill_ms.json").read_text()) if timed else None
    return Verdict(config.name, "ok", "", {int(b): ms for b, ms in v_ms.items()}, threads, now, prefill)


def compare_logits(reference: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> str | None:
    """Why `other` disagrees with the reference logits (None: it agrees): every value
    finite, |Δ| ≤ LOGIT_TOLERANCE, and the same top-1 wherever the reference's lead
    over its second choice exceeds MARGIN_FOR_TOP1."""
    for block, ref in reference.items():
        got = other.get(block)
        if got is None or got.shape != ref.shape:
            return f"no logits for the {block}-token forward"
        if not np.isfinite(got).all():
            return f"non-finite logits in the {block}-token forward"
        diff = float(np.abs(got - ref).max())
        if diff > LOGIT_TOLERANCE:
            return f"logits differ by {diff:.2f} from the plain kernels' in the {block}-token forward"
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > MARGIN_FOR_TOP1
        if (ref.argmax(1) != got.argmax(1))[clear].any():
            return f"a different greedy token than the plain kernels in the {block}-token forward"
    return None


class Prober:
    """One model's probe: the reference (plain kernels) first, every other
    configuration checked against its logits; children write into a scratch dir."""

    def __init__(self, path: Path, threads: int, scratch: Path):
        self.path, self.threads, self.scratch = path, threads, scratch
        self.reference: dict[str, np.ndarray] | None = None

    def run(self, config: K.KernelConfig, timed: bool) -> Verdict:
        out = self.scratch / f"{self.path.name}-{config.name}"
        out.mkdir()
        verdict = _run_child(config, self.path, out, self.threads, timed)
        if not verdict.usable:
            if self.reference is None:
                raise InvalidRequestError(
                    f"llama.cpp's plain kernels {verdict.describe()} on {self.path.name} in this machine's probe: "
                    f"the model or the llama-cpp-python build is broken here; reinstall llama-cpp-python "
                    f"(docs/kernels.md)")
            return verdict
        logits = dict(np.load(out / "logits.npz"))
        if self.reference is None:
            self.reference = logits
        elif (why := compare_logits(self.reference, logits)) is not None:
            return Verdict(config.name, "wrong", why, probed_at=verdict.probed_at)
        return verdict

    def probe(self, configs: list[K.KernelConfig], timed: bool) -> dict[str, Verdict]:
        """Verdicts for `configs` (the reference runs first, untimed unless it is one of them)."""
        ref = K.parse_config(K.REFERENCE)
        found = {}
        if self.reference is None:
            verdict = self.run(ref, timed and ref in configs)
            if ref in configs:
                found[ref.name] = verdict
        for config in configs:
            if config.name not in found:
                found[config.name] = self.run(config, timed)
        return found


# ---- choosing ---------------------------------------------------------------------------
WORKS = ("speculation", "decoding", "serving")  # what a process loads a model for (work_rate scores each)


def work_rate(v_ms: dict[int, float], work: str, streams: int = 1, prefill_ms: float | None = None) -> float:
    """Tokens per second the curve gives the work, its prompts' prefill counted, its rounds
    priced as the controller
    prices them (costs.round_rate: E / (v(K + 1) + o)): one token a round at K = 0 for
    decoding; for speculation, the geometric mean over SPECULATION_ALPHAS of the best rate
    over K (costs.best_rate);
    for serving `streams` concurrent requests (streams > 1), the tokens per second they
    get together when each decodes one token a step, the step priced as the engine
    prices it (CostModel.groups: one forward, or the split it would run). A server is
    chosen for its full load of one-token rows (where answers repeat its steps may run
    longer even blocks, docs/design.md#even-blocks; that is not scored). prefill_ms (a
    PREFILL_TOKENS-token prompt's) adds PROMPT_PER_TOKEN prompt tokens' prefill to each
    generated token's time."""
    rate = _generation_rate(v_ms, work, streams)
    if not rate or not prefill_ms:
        return rate
    return 1000.0 / (1000.0 / rate + PROMPT_PER_TOKEN * prefill_ms / PREFILL_TOKENS)


def _generation_rate(v_ms: dict[int, float], work: str, streams: int) -> float:
    """work_rate without the prompts: tokens per second of generation alone."""
    from ..costs import TIMED_K, CostModel, best_rate, round_rate
    if not v_ms:
        return 0.0
    cost = CostModel(verify_ms=dict(v_ms))
    if work == "decoding":
        return 1000.0 * round_rate(1.0, 0, cost)
    if work == "serving" and streams > 1:
        blocks = {seq: 1 for seq in range(streams)}
        return 1000.0 * streams / cost.step_as_run(blocks)
    best = [best_rate(cost, a, min(max(v_ms) - 1, TIMED_K)) for a in SPECULATION_ALPHAS]
    return 1000.0 * float(np.exp(np.mean(np.log(best))))


def describe_work(work: str, streams: int = 1) -> str:
    """The work a choice was made for, as its reason says it."""
    return f"serving {streams} streams" if work == "serving" and streams > 1 else \
        "speculation" if work == "serving" else work


def _small_model_path(path: Path) -> Path | None:
    try:
        from ..models.catalog import resolve_model
        small = resolve_model(SMALL_MODEL)
    except Exception:  # noqa: BLE001  (not installed: the target alone is probed)
        return None
    return None if small.resolve() == path.resolve() else small


def _say(text: str) -> None:
    print(f"speclm: {text}", file=sys.stderr, flush=True)


def choose_kernels(path: Path, request: str | None = None, threads: int | None = None,
                   work: str = "speculation", say=_say, apply: bool = True, streams: int = 1) -> KernelChoice:
    """The configuration to load `path` with: probed (once per machine, build and
    file), usable, fitting this process, and the best for `work` (WORKS; serving up
    to `streams` concurrent requests) among those the request allows. Sets the
    process-wide switches (apply False: neither sets them nor is bound by them, as
    for a report)."""
    request = K.check_request(request)
    build = K.build_info()
    family = request.partition("+")[0]
    if request != "auto" and (why := build.unavailable(family)):
        raise InvalidRequestError(f"kernels {request}: {why}; use --kernels auto (or {K.KERNELS_ENV}=auto)")
    threads = threads or os.cpu_count() or 1
    wanted = [c for c in build.configs() if K.matches(request, c)]
    verdicts = cached_verdicts(path, threads)
    missing = [c for c in wanted if c.name not in verdicts  # or checked only as the small model's screen:
               or (verdicts[c.name].usable and not verdicts[c.name].v_ms)]  # it is timed now
    if missing:
        verdicts.update(_probe_missing(path, missing, threads, say))
    known = {c.name: verdicts[c.name] for c in build.configs() if c.name in verdicts}  # in build order
    return _pick(path, request, work, build, {c.name: verdicts[c.name] for c in wanted}, known, apply, streams)


def _probe_missing(path: Path, missing: list[K.KernelConfig], threads: int, say) -> dict[str, Verdict]:
    """Probe `missing` on `path` and record the verdicts. The reference child runs
    first and says nothing: a file llama.cpp cannot load fails there, with its own error."""
    t0 = time.perf_counter()
    ref = K.parse_config(K.REFERENCE)
    with tempfile.TemporaryDirectory(prefix="speclm-probe-") as tmp:
        prober = Prober(path, threads, Path(tmp))
        verdict = prober.run(ref, timed=ref in missing)
        found = {ref.name: verdict} if ref in missing else {}
        say(f"probing llama.cpp kernels {', '.join(c.name for c in missing)} for {path.name} on this CPU in child "
            f"processes (once; verdicts cached in {cache_path()})")
        if busy := busy_warning(busy_cpus(), os.cpu_count() or 1,
                                fix="the probe's timings are cached and choose the kernels: re-probe on a quiet "
                                    "machine with `speclm doctor --reprobe`"):
            say(busy)
        found.update(_screen(path, [c for c in missing if c != ref], threads, Path(tmp)))
        for config in missing:
            if config.name not in found:
                found[config.name] = prober.run(config, timed=True)
    _record(path, threads, found)
    bad = [f"{n}: {v.describe()}" for n, v in found.items() if not v.usable]
    say(f"kernels probed in {time.perf_counter() - t0:.0f} s; "
        + (f"disabled {'; '.join(bad)}" if bad else "every configuration works"))
    return found


def _screen(path: Path, configs: list[K.KernelConfig], threads: int, scratch: Path) -> dict[str, Verdict]:
    """`skipped` verdicts for the configurations that fail on the small model
    (probed there now where it has no verdict); {} without a small model."""
    small = _small_model_path(path)
    if small is None or not configs:
        return {}
    verdicts = cached_verdicts(small, threads)
    todo = [c for c in configs if c.name not in verdicts]
    if todo:
        verdicts.update(Prober(small, threads, scratch).probe(todo, timed=False))
        _record(small, threads, {c.name: verdicts[c.name] for c in todo})
    return {c.name: Verdict(c.name, "skipped", f"{verdicts[c.name].describe()} on {small.name}",
                            probed_at=verdicts[c.name].probed_at)
            for c in configs if not verdicts[c.name].usable}


def _pick(path: Path, request: str, work: str, build: K.BuildInfo, wanted: dict[str, Verdict],
          everything: dict[str, Verdict], apply: bool, streams: int = 1) -> KernelChoice:
    usable = {n: v for n, v in wanted.items() if v.usable}
    if not usable:
        broken = "; ".join(f"{n} {v.describe()}" for n, v in wanted.items())
        raise InvalidRequestError(
            f"kernels {request} cannot run {path.name} on this machine: {broken} (probe verdicts cached in "
            f"{cache_path()}); choose --kernels auto, or re-probe after rebuilding llama-cpp-python with "
            f"`speclm doctor --reprobe`")
    fitting = {n: v for n, v in usable.items() if not apply or K.PROCESS.fits(K.parse_config(n), build) is None}
    if not fitting:
        n = next(iter(usable))
        raise InvalidRequestError(f"kernels {request} for {path.name}: {K.PROCESS.fits(K.parse_config(n), build)}; "
                                  f"load it in a new process, or with --kernels auto")
    scores = {n: work_rate(v.v_ms, work, streams, v.prefill_ms) for n, v in fitting.items()}
    best = next(iter(fitting))  # build order: llama.cpp's default first
    for n in fitting:
        if scores[n] > scores[best] * (1 + TIE):
            best = n
    config = K.parse_config(best)
    if apply:
        K.apply(config, path.name, build)
    return KernelChoice(config, request, _reason(request, describe_work(work, streams), best, scores, everything,
                                                 build), everything)


def _reason(request: str, work: str, best: str, scores: dict[str, float], everything: dict[str, Verdict],
            build: K.BuildInfo) -> str:
    how = "forced" if request == best else f"{request}: fastest for {work} by the probe's v(b)"
    others = [f"{scores[best] / s:.2f}x {n}" for n, s in scores.items() if n != best and s > 0]
    off = [f"{n} {v.status}" for n, v in everything.items() if not v.usable]
    if not build.amx:
        off.append("amx not in this build")
    return how + (f" ({', '.join(others)})" if others and request == "auto" else "") + \
        (f"; {', '.join(off)}" if off else "")


# ---- the child ------------------------------------------------------------------------
def _fault(config: K.KernelConfig) -> str | None:
    """The fault the test hook asks this child to simulate, if any."""
    for item in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        target, _, action = item.partition(":")
        if K.matches(target.strip(), config):
            return action.strip()
    return None


def _child(args: argparse.Namespace) -> int:
    from .llamacpp import LlamaCppBackend
    config = K.parse_config(args.config)
    fault = _fault(config)
    K.apply(config, Path(args.model).name)
    try:
        backend = LlamaCppBackend(args.model, n_ctx=max(PROBE_CONTEXT + 2 * max(TIMED_BLOCKS), PREFILL_TOKENS + 16),
                                  n_threads=args.threads, n_seq_max=1, kernels=config)
    except SpeclmError as exc:
        print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        return MODEL_UNUSABLE
    tokens = (backend.tokenize(_TEXT, add_special=False) * 4)[:16 + max(PROBE_BLOCKS)]
    seq = backend.new_sequence()
    backend.prefill(seq, tokens[:16])
    logits = {}
    for block in PROBE_BLOCKS:
        if fault == "segv" and block > 1:  # where llama.cpp's AMX path dies
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "hang" and block > 1:
            time.sleep(10 * PROBE_TIMEOUT_S)
        logits[str(block)] = backend.score(seq, tokens[16:16 + block])
        backend.rollback(seq, 16)
    backend.free(seq)
    if fault == "wrong":
        logits = {b: np.roll(rows, 7, axis=1) for b, rows in logits.items()}
    np.savez(Path(args.out) / "logits.npz", **logits)
    if args.time:
        from ..costs import calibrate, time_prefill
        cost = calibrate(backend, None, blocks=TIMED_BLOCKS, repeats=2, context=PROBE_CONTEXT)  # min of 2
        (Path(args.out) / "v_ms.json").write_text(json.dumps(cost.verify_ms))
        (Path(args.out) / "prefill_ms.json").write_text(json.dumps(time_prefill(backend, PREFILL_TOKENS)))
    backend.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m speclm.backends.probe",
                                description="probe one kernel configuration (speclm runs this itself)")
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--time", action="store_true")
    return _child(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
