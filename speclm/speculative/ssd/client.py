"""The verifier's side of SSD: the speculator process, per-request channels to
it, and `SSDProposer`, the Proposer the ordinary loop drives.

SSD adds a speculator, not a second engine: `Generation` calls
`proposer.propose(context, k)` as for any proposer. The proposer reads the
previous round's outcome (k accepted, bonus t*) off the new context, sends it,
and gets the next block, pre-drafted while the target was verifying (a hit)
or drafted now (a miss). The exact q of every drafted token travels with it.

If the speculator dies or stops answering within `timeout_s`, it is lost:
every request goes on with a synchronous proposer (one log line): same output,
nothing lost; the next SSD request restarts it (supervisor.py). If the
speculator answers one request's block with an error, only that request goes
on synchronously: the speculator keeps serving the others.

Where the speculator runs (`SpeculatorConfig`) and the worker's command line
generated from it are in launch.py.
"""

from __future__ import annotations

import atexit
import logging
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable

import numpy as np
import zmq

from ...costs import clock_ms
from ...errors import BackendError
from ...sampling import SamplingParams
from ..proposers.base import Draft, Proposer
from .launch import SpeculatorConfig, worker_command
from .options import SSDOptions
from .speculator import Block
from .wire import block_from, decode, encode, params_to_dict

log = logging.getLogger("speclm.ssd")


class SpeculatorLost(Exception):
    """The speculator died, timed out or the transport failed: unusable for every request."""


class SessionFailed(SpeculatorLost):
    """The speculator answered this request's block with an error: only this request is affected."""


class SpeculatorProcess:
    """A speculator worker (spawned, or reached at cfg.addr) shared by all requests."""

    def __init__(self, model: str, cfg: SpeculatorConfig = SpeculatorConfig()):
        self.model, self.cfg = model, cfg.sized()
        self.ctx = zmq.Context()
        self.proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._lock = threading.Lock()
        self.lost: str | None = None  # why the speculator is unusable, once it is
        self.lost_at: float | None = None  # time.monotonic() when it was found lost
        self.started_at = time.monotonic()
        self._retired = False
        self.addr = (cfg.locate() if cfg.locate else cfg.addr) or self._spawn()
        atexit.register(self.close)
        try:
            self.hello = self._hello()
        except BaseException:
            self.close()
            raise

    def _spawn(self) -> str:
        self._tmp = tempfile.TemporaryDirectory(prefix="speclm-ssd-")
        addr = f"ipc://{self._tmp.name}/speculator.sock"
        cmd = worker_command(self.model, self.cfg, addr)
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr)
        return addr

    def stats(self) -> dict:
        """The worker's open sessions and live KV sequences."""
        return self._hello(op="stats")

    def _hello(self, op: str = "hello") -> dict:
        sock = self._socket()
        try:
            sock.send_multipart(encode({"op": op}))
            deadline = time.monotonic() + self.cfg.start_timeout_s
            while not sock.poll(100):
                if self.proc is not None and self.proc.poll() is not None:
                    self._stderr.seek(0)
                    err = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
                    raise BackendError(f"the SSD speculator process exited ({self.proc.returncode}): "
                                       f"{err[-1] if err else 'no message'}")
                if time.monotonic() > deadline:
                    raise BackendError(f"no SSD speculator answered at {self.addr} within "
                                       f"{self.cfg.start_timeout_s:.0f} s: start one with `speclm speculator "
                                       f"--bind ADDR --model NAME` or drop --speculator-addr")
            header, _ = decode(sock.recv_multipart())
            return header
        finally:
            sock.close()

    def _socket(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.addr)
        return sock

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def open(self) -> ZmqChannel:
        if self.lost:
            raise SpeculatorLost(self.lost)
        return ZmqChannel(self)

    def check(self) -> bool:
        """Whether the speculator is usable; a spawned worker that exited is marked lost (and reaped)."""
        if self.lost is None and self.proc is not None and self.proc.poll() is not None:
            self.mark_lost(f"process {self.proc.pid} exited with {self.proc.returncode}")
        return self.lost is None

    def mark_lost(self, why: str) -> None:
        """Unusable from now on, for every request: one log line; a spawned worker
        still running (hung) is terminated and reaped in the background."""
        with self._lock:
            if self.lost is not None:
                return
            self.lost, self.lost_at = why, time.monotonic()
        log.warning("SSD speculator lost (%s): requests continue on the synchronous draft path", why)
        self._stop_process()

    def _stop_process(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()

        def reap() -> None:  # no zombie, however long it takes to die
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

        threading.Thread(target=reap, name="speclm-ssd-reaper", daemon=True).start()

    def retire(self) -> None:
        """Release a lost speculator (process reaped, temp directory removed) without
        touching sockets other threads may still hold: its ZeroMQ context ends in
        the background once they are closed (their next call fails: they fall back)."""
        if self._retired:
            return
        self._retired = True
        atexit.unregister(self.close)
        self.mark_lost("retired")
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._cleanup_tmp()
        if not self.ctx.closed:
            threading.Thread(target=self.ctx.term, name="speclm-ssd-term", daemon=True).start()

    def _cleanup_tmp(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        if getattr(self, "_stderr", None) is not None:
            self._stderr.close()
            self._stderr = None

    def close(self) -> None:
        """Shut the worker down (ask, then terminate, then kill); idempotent."""
        atexit.unregister(self.close)
        if self.proc is not None and self.proc.poll() is None and self.lost is None:
            sock = self._socket()
            try:
                sock.send_multipart(encode({"op": "shutdown"}))
                sock.poll(2000)
            finally:
                sock.close()
        if self.proc is not None:
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(3)
        self._cleanup_tmp()
        if not self.ctx.closed and not self._retired:  # a retired context is ending in the background
            self.ctx.destroy(linger=0)  # also closes channels of requests still in flight


class ZmqChannel:
    """One request's REQ socket to the speculator."""

    def __init__(self, speculator: SpeculatorProcess):
        self.speculator = speculator
        self.sid = uuid.uuid4().hex
        self.sock = speculator._socket()

    def send(self, header: dict) -> None:
        """Send a request now; `receive()` waits for its block (the speculator works meanwhile)."""
        if self.speculator.lost:
            raise SpeculatorLost(self.speculator.lost)
        try:
            self.sock.send_multipart(encode({**header, "sid": self.sid}))
        except zmq.ZMQError as exc:
            raise SpeculatorLost(f"transport error: {exc}") from None

    def request(self, header: dict) -> Block:
        self.send(header)
        return self.receive()

    def receive(self) -> Block:
        sp = self.speculator
        try:
            deadline = time.monotonic() + sp.cfg.timeout_s
            while not self.sock.poll(50):
                if sp.proc is not None and sp.proc.poll() is not None:
                    raise SpeculatorLost(f"process {sp.proc.pid} exited with {sp.proc.returncode}")
                if time.monotonic() > deadline:
                    raise SpeculatorLost(f"no answer within {sp.cfg.timeout_s:g} s")
            frames = self.sock.recv_multipart()
        except zmq.ZMQError as exc:
            raise SpeculatorLost(f"transport error: {exc}") from None
        try:
            reply, arrays = decode(frames)
            if not reply.get("ok"):
                raise SessionFailed(f"speculator error: {reply.get('error')}")
            return block_from(reply, arrays)
        except SessionFailed:
            raise
        except Exception as exc:
            raise SessionFailed(f"malformed reply: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        if not self.speculator.lost and not self.sock.closed:
            try:
                self.sock.send_multipart(encode({"op": "close", "sid": self.sid}))
                self.sock.poll(200)
            except zmq.ZMQError:
                pass
        self.sock.close()


class SSDProposer(Proposer):
    """Proposes the speculator's blocks; falls back to `fallback()` if it is lost."""

    def __init__(self, open_channel: Callable[[], object], opts: SSDOptions, k: int,
                 fallback: Callable[[], Proposer], name: str = "ssd", p_min: float = 0.0):
        """k: the block length the speculator drafts (SpecConfig.k); p_min: where its
        drafts stop (SpecConfig.p_min), sent in the start message."""
        self.open_channel, self.opts, self.k, self.make_fallback = open_channel, opts, k, fallback
        self.p_min = p_min
        self.name = name
        self.channel = None
        self.sync_proposer: Proposer | None = None
        self._ctx_len = 0  # len(context) the last block continued
        self._block: list[int] = []
        self._info: dict | None = None
        self._started = False  # the start request is in flight

    def begin(self, context: list[int], params: SamplingParams) -> None:
        """Ask for the first block now, so the speculator prefills while the target does."""
        if self.sync_proposer is None and self.channel is None:
            try:
                self.channel = self.open_channel()
                self.channel.send(self._start_header(context, params))
                self._started, self._begun_len = True, len(context)
            except SpeculatorLost as exc:
                self._lose(exc)

    def _start_header(self, context: list[int], params: SamplingParams) -> dict:
        return {"op": "start", "context": list(context), "params": params_to_dict(params),
                "opts": self.opts.to_dict(), "k": self.k, "seed": params.seed, "p_min": self.p_min}

    def propose(self, context: list[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        if self.sync_proposer is None:
            t0 = clock_ms()
            try:
                block = self._next_block(context, params)
            except SpeculatorLost as exc:
                self._lose(exc)
            else:
                self._ctx_len, self._block = len(context), list(block.tokens)
                self._info = {"hit": block.hit, **block.info, "wait_ms": clock_ms() - t0}
                return Draft(block.tokens, block.q)  # draft() keeps the first k
        self._info = {"hit": False, "fallback": "sync"}
        return self.sync_proposer.propose(context, k, params, rng)

    def _next_block(self, context: list[int], params: SamplingParams) -> Block:
        if self._started:
            self._started = False
            block = self.channel.receive()
            if len(context) == self._begun_len:
                return block
            self._ctx_len, self._block = self._begun_len, []  # context moved on (plain steps): resync below
        elif self.channel is None:
            self.channel = self.open_channel()
            return self.channel.request(self._start_header(context, params))
        a = len(context) - self._ctx_len - 1  # accepted tokens of the last block
        if 0 <= a <= len(self._block) and context[self._ctx_len:self._ctx_len + a] == self._block[:a]:
            return self.channel.request({"op": "outcome", "k": a, "t": int(context[-1])})
        return self.channel.request({"op": "sync", "context": list(context)})

    def _lose(self, exc: SpeculatorLost) -> None:
        """Go on synchronously. A failed session (SessionFailed) concerns this request
        only: one log line, the speculator stays in service. A lost speculator is
        marked lost for all: one log line per speculator (none when it was already
        known to be lost before this request opened a channel)."""
        why = str(exc)
        if isinstance(exc, SessionFailed):
            log.warning("SSD block failed (%s): this request continues on the synchronous draft path", why)
        elif self.channel is not None:
            speculator = getattr(self.channel, "speculator", None)
            if speculator is not None:
                speculator.mark_lost(why)
            else:
                log.warning("SSD speculator lost (%s): continuing on the synchronous draft path", why)
        self._close_channel()
        self.sync_proposer = self.make_fallback()

    def round_info(self) -> dict | None:
        return self._info

    def _close_channel(self) -> None:
        if self.channel is not None:
            try:
                if self._started:  # a start request is in flight: take its answer first
                    self._started = False
                    self.channel.receive()
            except SpeculatorLost:
                pass
            try:
                self.channel.close()
            except Exception:
                pass
            self.channel = None

    def close(self) -> None:
        self._close_channel()
        if self.sync_proposer is not None:
            self.sync_proposer.close()
