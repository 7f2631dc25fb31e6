"""A report is one ordered list of sections; summary.json, report.md and the console are
each rendered from that list, so the three say the same things in the same order.

A section holds its title, its entries of summary.json, the lines under its heading
in report.md and its console lines. The first section heads the report: its title
is the document's (`# title`), the others' are `## title` headings; an untitled
section's lines stand on their own. A section whose markdown is None is left out
of report.md (its entries still go to summary.json), one with no console lines is
left off the console.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape


@dataclass(frozen=True)
class Section:
    """One part of a report (module docstring)."""

    title: str | None
    data: dict[str, Any] = field(default_factory=dict)  # its summary.json entries, in order
    markdown: list[str] | None = None  # the lines under its heading
    console: list[Any] = field(default_factory=list)  # rich markup lines or renderables (a Table)


def warnings_section(warnings: Sequence[str]) -> Section:
    """The run's warnings: summary.json's "warnings", quoted under the report's head, in red on the console."""
    return Section(None, {"warnings": list(warnings)}, [f"> **WARNING**: {w}" for w in warnings] or None,
                   [f"[bold red]WARNING:[/] {escape(w)}" for w in warnings])


def summary_of(sections: Sequence[Section]) -> dict:
    """summary.json: every section's entries, in section order (a key belongs to one section)."""
    out: dict[str, Any] = {}
    for s in sections:
        clash = out.keys() & s.data.keys()
        assert not clash, f"summary keys {sorted(clash)} given by two sections"
        out.update(s.data)
    return out


def lines_of(s: Section, head: bool = False) -> list[str]:
    """A section's report.md lines: its heading (`# title` when it heads the report) and
    its markdown; none when its markdown is None."""
    if s.markdown is None:
        return []
    if head:
        return [f"# {s.title}", "", *s.markdown]
    return (["", f"## {s.title}", ""] if s.title else [""]) + s.markdown


def markdown_of(sections: Sequence[Section]) -> str:
    """report.md."""
    return "\n".join(line for i, s in enumerate(sections) for line in lines_of(s, head=i == 0))


def print_sections(sections: Sequence[Section], console: Console | None = None) -> None:
    """The console's lines (rich), section by section."""
    if console is None:
        console = Console(highlight=False)
        if not console.is_terminal:
            console.width = max(console.width, 150)
    for s in sections:
        for line in s.console:
            console.print(line)


def write_report(out_dir: Path, sections: Sequence[Section], manifest: dict) -> tuple[dict, Path]:
    """summary.json, manifest.json and report.md into out_dir: (the summary, report.md's path)."""
    summary = summary_of(sections)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    report = out_dir / "report.md"
    report.write_text(markdown_of(sections), encoding="utf-8")
    return summary, report
