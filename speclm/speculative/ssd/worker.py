"""The speculator process: owns the draft model, answers each verification
outcome with the next block, and pre-drafts between messages.

    python -m speclm.speculative.ssd.worker --bind ipc:///tmp/x.sock --model qwen2.5-coder-0.5b
    speclm speculator --bind tcp://0.0.0.0:5555 --model qwen2.5-coder-0.5b   # another machine

One ZeroMQ ROUTER socket serves every verifier session (each a REQ socket).
Between messages the loop runs one pre-drafting unit at a time, round-robin
over sessions, and polls the socket after each, so an outcome is answered as
soon as the current draft forward ends.

A failure inside one session (answering a message, or pre-drafting) closes
that session only: its next message is answered {"ok": false, "error"} (the
verifier drafts that request synchronously) and the worker serves the others.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import zmq

from ...backends.base import Backend
from ...errors import InvalidRequestError
from .launch import worker_config, worker_options
from .options import SSDOptions
from .speculator import SpeculatorSession
from .wire import block_frames, decode, encode, session_from_start

TOY_PREFIX = "toy:"


def toy_spec(backend) -> str:
    """A model spec that rebuilds this ToyBackend in another process."""
    return TOY_PREFIX + json.dumps({"vocab_size": backend.vocab_size, "seed": backend.seed,
                                    "order": backend.order, "sharpness": backend.sharpness,
                                    "eos_id": next(iter(backend.eos_ids), None), "n_ctx": backend.n_ctx,
                                    "alphabet": backend.alphabet, "name": backend.name})


def model_spec(spec, backend: Backend) -> str:
    """What the worker process needs to load the same draft model."""
    if isinstance(spec, str):
        return spec
    if backend.path is not None:
        return str(backend.path)
    if hasattr(backend, "logits_for"):
        return toy_spec(backend)
    raise ValueError(f"cannot run draft {backend.name} in a speculator process: pass a model name or GGUF path")


def load_model(spec: str, n_ctx: int, threads: int | None, max_sequences: int,
               kernels: str | None = None) -> Backend:
    if spec.startswith(TOY_PREFIX):
        from ...backends.toy import ToyBackend
        return ToyBackend(**json.loads(spec[len(TOY_PREFIX):]))
    from ...backends.load import load_backend
    return load_backend(spec, n_ctx, threads, max_sequences, kernels=kernels, work="decoding")


class Worker:
    """Sessions by id on one draft backend, shared by up to `sessions` of them."""

    def __init__(self, backend: Backend, sessions: int = 1):
        self.backend, self.max_sessions = backend, sessions
        self.sessions: dict[str, SpeculatorSession] = {}
        self.failed: dict[str, str] = {}  # sid -> why pre-drafting failed (told at its next message)
        self._turn = 0

    def handle(self, header: dict) -> list[bytes]:
        """The reply to one message; never raises (a failure is the reply {"ok": false},
        and closes the message's session)."""
        try:
            return self._handle(header)
        except Exception as exc:  # the verifier falls back; the worker keeps serving others
            try:
                self._close(header.get("sid"))
            except Exception:  # noqa: BLE001 - no session to close (e.g. not a JSON object)
                pass
            return encode({"ok": False, "error": f"{type(exc).__name__}: {exc}"})

    def _handle(self, header: dict) -> list[bytes]:
        op = header.get("op")
        if op in ("outcome", "sync") and header.get("sid") in self.failed:
            return encode({"ok": False, "error": f"pre-drafting failed: {self.failed.pop(header['sid'])}"})
        if op == "hello":
            return encode({"ok": True, "pid": os.getpid(), "model": self.backend.name,
                           "vocab_size": self.backend.vocab_size})
        if op == "start":
            self._close(header["sid"])
            s = session_from_start(self.backend, header, live_sessions=lambda: len(self.sessions),
                                   sessions=self.max_sessions)
            self.sessions[header["sid"]] = s
            return block_frames(s.start())
        if op == "outcome":
            return block_frames(self._session(header).resolve(int(header["k"]), int(header["t"])))
        if op == "sync":
            return block_frames(self._session(header).sync(header["context"]))
        if op == "close":
            self._close(header["sid"])
            return encode({"ok": True})
        if op == "stats":
            return encode({"ok": True, "sessions": len(self.sessions),
                           "live_sequences": getattr(self.backend, "live_sequences", None)})
        if op == "shutdown":
            return encode({"ok": True})
        return encode({"ok": False, "error": f"unknown op {op!r}"})

    def _session(self, header: dict) -> SpeculatorSession:
        s = self.sessions.get(header.get("sid"))
        if s is None:
            raise KeyError(f"no session {header.get('sid')!r} (it was closed or never started)")
        return s

    def _close(self, sid) -> None:
        self.failed.pop(sid, None)
        s = self.sessions.pop(sid, None)
        if s is not None:
            try:
                s.close()
            except Exception as exc:  # its sequences may leak; the worker stays up
                print(f"speculator: closing session {sid}: {type(exc).__name__}: {exc}", file=sys.stderr)

    def work_once(self) -> bool:
        """One pre-drafting unit for the next session with work; False if none has any.
        A session whose pre-drafting raises is closed and its failure kept for its next message."""
        ids = list(self.sessions)
        for i in range(len(ids)):
            sid = ids[(self._turn + i) % len(ids)]
            try:
                more = self.sessions[sid].work()
            except Exception as exc:
                self._close(sid)
                self.failed[sid] = f"{type(exc).__name__}: {exc}"
                continue
            if more:
                self._turn = (self._turn + i + 1) % max(1, len(ids))
                return True
        return False

    def answer(self, frames: list[bytes]) -> tuple[list[bytes], bool]:
        """(reply frames, whether to stop) for one request's frames; never raises."""
        try:
            header, _ = decode(frames)
        except Exception as exc:
            return encode({"ok": False, "error": f"malformed message: {type(exc).__name__}: {exc}"}), False
        return self.handle(header), isinstance(header, dict) and header.get("op") == "shutdown"

    def serve(self, sock: zmq.Socket, parent_pid: int | None) -> None:
        busy = False
        while True:
            if sock.poll(0 if busy else 100):
                ident, empty, *frames = sock.recv_multipart()
                reply, stop = self.answer(frames)
                sock.send_multipart([ident, empty, *reply])
                if stop:
                    return
                busy = True
            else:
                if parent_pid is not None and os.getppid() != parent_pid:
                    return  # the verifier is gone (even if it was SIGKILLed)
                busy = busy and self.work_once()


def parser() -> argparse.ArgumentParser:
    """`speclm speculator`'s flags: where to listen, what to load, whom to outlive, and
    the worker settings of SpeculatorConfig (launch.py), generated from their declarations."""
    ap = argparse.ArgumentParser(prog="speclm speculator", description="Run an SSD speculator process.")
    ap.add_argument("--bind", required=True, help="ZeroMQ address, e.g. ipc:///tmp/s.sock or tcp://0.0.0.0:5555")
    ap.add_argument("--model", required=True, help="draft model name or GGUF path")
    for opt in worker_options():  # speclm.commands.options.add_option is a layer above
        shown = "" if opt.default is None else f" (default {opt.default})"
        ap.add_argument(opt.flag, dest=opt.dest, type=opt.kind, default=opt.default, choices=opt.choices,
                        metavar=opt.metavar, help=opt.help + shown)
    ap.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    try:
        cfg = worker_config(args)
    except InvalidRequestError as exc:
        ap.error(str(exc))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the verifier's: it shuts us down
    if cfg.cores:
        os.sched_setaffinity(0, set(cfg.cores))
    try:
        backend = load_model(args.model, cfg.n_ctx, cfg.threads, cfg.max_sequences, cfg.kernels)
    except Exception as exc:
        print(f"speculator: cannot load {args.model}: {exc}", file=sys.stderr)
        return 2
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(args.bind)
    except zmq.ZMQError as exc:
        print(f"speculator: cannot bind {args.bind}: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        sessions = cfg.sessions or max(1, cfg.max_sequences // (SSDOptions().fanout + 1))
        Worker(backend, sessions).serve(sock, args.parent_pid)
    finally:
        sock.close()
        ctx.term()
        backend.close()
    print(f"speculator: served {time.perf_counter() - t0:.1f} s, exiting", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
