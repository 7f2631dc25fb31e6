"""An SSD speculator in the test process: pre-drafting runs exactly as far as a
test asks, so cache hits and misses can both be forced."""

from __future__ import annotations

from speclm.backends.base import Backend
from speclm.speculative.ssd.speculator import Block, SpeculatorSession
from speclm.speculative.ssd.wire import session_from_start


class InlineChannel:
    """The speculator in this process (tests, one-core runs). Before answering an
    outcome it runs `predraft` pre-drafting units (None: all of them, a
    complete cache; 0: none, so every outcome misses)."""

    def __init__(self, backend: Backend, predraft: int | None = None):
        self.backend, self.predraft = backend, predraft
        self.session: SpeculatorSession | None = None

    def send(self, header: dict) -> None:
        self._pending = header

    def receive(self) -> Block:
        return self.request(self._pending)

    def request(self, header: dict) -> Block:
        op = header["op"]
        if op == "start":
            self.close()
            self.session = session_from_start(self.backend, header)
            self.session.deadline = self.predraft is not None
            return self.session.start()
        n = 0
        while (self.predraft is None or n < self.predraft) and self.session.work():
            n += 1
        if op == "outcome":
            return self.session.resolve(header["k"], header["t"])
        return self.session.sync(header["context"])

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
