"""The run's progress bars on stderr: requests and concurrency rows done (rich), or nothing."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ProgressBars:
    """Request (and concurrency) progress bars on stderr, or nothing."""

    def __init__(self, show: bool, requests: int, concurrency: int):
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=Console(stderr=True)) if show else None
        if self.bar:
            self.bar.start()
            self.req = self.bar.add_task("requests", total=requests)
            self.conc = self.bar.add_task("concurrency", total=concurrency, visible=concurrency > 0)

    def on_request(self, record: dict) -> None:
        if self.bar:
            self.bar.advance(self.req)

    def on_concurrency(self, row: dict) -> None:
        if self.bar:
            self.bar.advance(self.conc)

    def stop(self) -> None:
        if self.bar:
            self.bar.stop()
