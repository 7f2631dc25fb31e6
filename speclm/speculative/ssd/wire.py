"""The speculator ↔ verifier messages over ZeroMQ multipart frames.

A message is [header JSON, *arrays]: the header names the operation and its
scalar fields; each array frame is a raw little-endian float64 distribution
(the exact q a drafted token was drawn from). No pickle: a speculator on
another machine cannot make the verifier execute anything.

Requests:  {"op": "hello"} | {"op": "start", "sid", "context", "params", "opts", "k", "seed", "p_min"}
           | {"op": "outcome", "sid", "k", "t"} | {"op": "sync", "sid", "context"}
           | {"op": "close", "sid"} | {"op": "stats"} | {"op": "shutdown"}
Replies:   {"ok": true, ...} with a block as "tokens", "q_index" (positions
           that carry a q frame), "hit", "info"; or {"ok": false, "error": "..."}.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np

from ...sampling import SamplingParams
from .options import SSDOptions
from .speculator import Block, SpeculatorSession


def encode(header: dict, arrays: list[np.ndarray] = ()) -> list[bytes]:
    return [json.dumps(header).encode()] + [np.ascontiguousarray(a, dtype="<f8").tobytes() for a in arrays]


def decode(frames: list[bytes]) -> tuple[dict, list[np.ndarray]]:
    header = json.loads(frames[0])
    return header, [np.frombuffer(f, dtype="<f8") for f in frames[1:]]


def block_frames(block: Block) -> list[bytes]:
    idx = [i for i, q in enumerate(block.q) if q is not None]
    header = {"ok": True, "tokens": block.tokens, "q_index": idx, "hit": block.hit, "info": block.info}
    return encode(header, [block.q[i] for i in idx])


def block_from(header: dict, arrays: list[np.ndarray]) -> Block:
    q: list[np.ndarray | None] = [None] * len(header["tokens"])
    for i, a in zip(header["q_index"], arrays):
        q[i] = a
    return Block([int(t) for t in header["tokens"]], q, bool(header["hit"]), header.get("info", {}))


def params_to_dict(p: SamplingParams) -> dict:
    d = asdict(p)
    d["stop"] = list(p.stop)
    return d


def params_from(d: dict) -> SamplingParams:
    return SamplingParams(**{**d, "stop": tuple(d.get("stop", ()))})


def opts_from(d: dict) -> SSDOptions:
    return SSDOptions(**d)


def session_from_start(backend, header: dict, live_sessions=lambda: 1, sessions: int = 1) -> SpeculatorSession:
    """The speculator session a "start" request asks for (sessions: how many share the backend)."""
    return SpeculatorSession(backend, header["context"], params_from(header["params"]), opts_from(header["opts"]),
                             header["k"], header.get("seed"), live_sessions=live_sessions, sessions=sessions,
                             p_min=float(header.get("p_min", 0.0)))
