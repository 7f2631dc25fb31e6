"""The analyse stage: every figure of a run, from its records alone (no model is loaded):
the report's rows (groups.py), the copy ceiling with its replays (ceiling.py) and the
variants section (variants.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...speculative.proposers.suffix_index import SuffixConfig
from .ceiling import CeilingInput, copy_ceilings
from .groups import group_rows
from .variants import build_variants


@dataclass
class Figures:
    """What the write stage renders beside the records: group rows, copy-ceiling rows,
    streams.jsonl's lines and the variants section."""

    rows: list[dict]
    ceilings: list[dict]
    streams: list[dict]
    variants: dict


def analyse(requests: Sequence[dict], rounds: Sequence[dict], ceilings: Sequence[CeilingInput], *,
            targets: list[dict], drafts: list[dict], ceiling_methods: Sequence[str], ceiling_k: int,
            suffix: SuffixConfig, quality: bool, text_labels: list[str]) -> Figures:
    """`requests`, `rounds`: the run's records (requests.jsonl, rounds.jsonl); `ceilings`: one
    input per target (none: no ceiling); `targets`, `drafts`: the models' variants lines;
    `quality`: whether perplexity and agreement were measured, on `text_labels`."""
    rows, streams = copy_ceilings(ceilings, rounds, methods=ceiling_methods, k_max=ceiling_k, suffix=suffix)
    variants = build_variants(requests, targets, drafts, quality=quality, text_labels=text_labels)
    return Figures(group_rows(requests), rows, streams, variants)
