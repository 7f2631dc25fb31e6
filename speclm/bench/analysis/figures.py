"""The analyse stage: every figure of a run, from its records alone (no model is loaded):
the report's rows and verdicts (groups.py), the copy ceiling with its replays
(ceiling.py), the variants section (pair_ranking.py), the halves, the Medusa heads, the SSD
projection, the concurrency rows and pairs, the requests' latencies and the greedy
divergences. Every row that names a config carries its label (groups.labelled), so the
write stage only renders them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...speculative.proposers.suffix_index import SuffixConfig
from .ceiling import CeilingInput, copy_ceilings
from .groups import divergences, group_rows, labelled, latencies, verdicts
from .halves import halves
from .heads import heads_rows
from .projection import project
from .scaling import paired
from .pair_ranking import build_variants


@dataclass
class Figures:
    """What the write stage renders beside the records: group rows and their verdicts,
    copy-ceiling rows, streams.jsonl's lines, the variants section, the first/second half
    rows, Medusa heads rows, the SSD projection, the concurrency rows and their pairs, greedy
    divergences and each request's latency (the CDF's points); each row labelled."""

    rows: list[dict]
    verdicts: list[dict]
    ceilings: list[dict]
    streams: list[dict]
    variants: dict
    halves: list[dict]
    heads: list[dict]
    projection: list[dict]
    concurrency: list[dict]
    paired: list[dict]
    divergences: list[dict]
    latencies: list[dict]


def analyse(requests: Sequence[dict], concurrency: Sequence[dict], rounds: Sequence[dict],
            ceilings: Sequence[CeilingInput], *, targets: list[dict], drafts: list[dict],
            ceiling_methods: Sequence[str], ceiling_k: int, suffix: SuffixConfig, quality: bool,
            text_labels: list[str]) -> Figures:
    """`requests`, `concurrency`, `rounds`: the run's records (requests.jsonl, its concurrency
    rows, rounds.jsonl); `ceilings`: one input per target (none: no ceiling); `targets`,
    `drafts`: the models' variants lines;
    `quality`: whether perplexity and agreement were measured, on `text_labels`."""
    ceiling_rows, streams = copy_ceilings(ceilings, rounds, methods=ceiling_methods, k_max=ceiling_k, suffix=suffix)
    variants = build_variants(requests, targets, drafts, quality=quality, text_labels=text_labels)
    rows = group_rows(requests)
    judged, diverged, latency = verdicts(rows), divergences(requests), latencies(requests)
    in_flight = labelled(concurrency)
    return Figures(rows, judged, ceiling_rows, streams, variants, halves(requests), heads_rows(requests, rows),
                   project(requests), in_flight, paired(concurrency), diverged, latency)
