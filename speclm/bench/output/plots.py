"""Benchmark plots (matplotlib, Agg backend): PNG files under <out>/plots/.

- speedup_vs_k.png             p50 speedup vs K, one panel per category, one line per method (× T)
- per_position_acceptance.png  acceptance at draft position j, one line per method × K (× T)
- latency_cdf.png              empirical CDF of request latency per method config
- concurrency.png              throughput vs requests in flight (only with --concurrency)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import median

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..setup.methods import BASELINE  # noqa: E402


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _series_name(row: dict, temps: int, name: str = "label") -> str:
    """The row's label (or its `name` field), with its T when the temperatures vary."""
    return row[name] if temps < 2 else f"{row[name]} T={row['temperature']:g}"


def plot_speedup_vs_k(rows: Sequence[dict], path: Path) -> None:
    cats = list(dict.fromkeys(r["category"] for r in rows)) or ["(none)"]
    temps = len({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(cats), figsize=(4.2 * len(cats), 3.6), squeeze=False)
    for ax, cat in zip(axes[0], cats):
        lines: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            if r["category"] == cat and r["method"] != BASELINE and r["speedup_dist"]["p50"] is not None:
                name = _series_name(r, temps, "method_label")
                lines.setdefault(name, []).append((r["k"], r["speedup_dist"]["p50"]))
        for name, pts in lines.items():
            pts.sort()
            ax.plot([k for k, _ in pts], [s for _, s in pts], marker="o", label=name)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="AR")
        ax.set_title(cat)
        ax.set_xticks(sorted({k for pts in lines.values() for k, _ in pts}))
        ax.set_xlabel("K (draft tokens per round)")
        ax.set_ylabel("speedup vs AR (p50)")
        ax.legend(fontsize=7)
    _save(fig, path)


def plot_per_position(rows: Sequence[dict], path: Path) -> None:
    scope = "all" if any(r["category"] == "all" for r in rows) else rows[0]["category"] if rows else ""
    temps = len({r["temperature"] for r in rows})
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["category"] == scope and r["method"] != BASELINE and r["per_position_acceptance"]:
            ys = r["per_position_acceptance"]
            ax.plot(range(1, len(ys) + 1), ys, marker="o", label=_series_name(r, temps))
    ax.set_ylim(0, 1.05)
    ax.set_xticks(range(1, 1 + max((len(r["per_position_acceptance"]) for r in rows), default=1)))
    ax.set_xlabel("draft position j")
    ax.set_ylabel("P(a ≥ j | K ≥ j)")
    ax.set_title(f"per-position acceptance ({scope} prompts)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    _save(fig, path)


def plot_latency_cdf(latencies: Sequence[dict], path: Path) -> None:
    temps = len({r["temperature"] for r in latencies})
    series: dict[str, list[float]] = {}
    for r in latencies:
        series.setdefault(_series_name(r, temps), []).append(r["wall_ms"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, xs in series.items():
        xs = sorted(xs)
        ax.step([xs[0], *xs], [0.0, *((i + 1) / len(xs) for i in range(len(xs)))], where="post", label=name)
    ax.set_xlabel("request latency (ms)")
    ax.set_ylabel("fraction of requests ≤ x")
    ax.set_title("latency CDF")
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_concurrency(rows: Sequence[dict], path: Path) -> None:
    """Throughput against N, one line per config: the median over repeats, with a
    bar over their min–max when a row ran more than once."""
    temps = len({r["temperature"] for r in rows})
    series: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        series.setdefault(_series_name(r, temps), {}).setdefault(r["concurrency"], []).append(
            r["throughput_tok_s"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, by_n in series.items():
        ns = sorted(by_n)
        mid = [median(by_n[n]) for n in ns]
        err = [[m - min(by_n[n]) for n, m in zip(ns, mid)], [max(by_n[n]) - m for n, m in zip(ns, mid)]]
        ax.errorbar(ns, mid, yerr=err if any(len(by_n[n]) > 1 for n in ns) else None, marker="o", capsize=3,
                    label=name)
    ax.set_xticks(sorted({r["concurrency"] for r in rows}))
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("throughput (tokens/s; median, bar = min–max over repeats)")
    ax.set_title("throughput vs concurrency")
    ax.legend(fontsize=7)
    _save(fig, path)


def write_plots(rows: Sequence[dict], concurrency: Sequence[dict], latencies: Sequence[dict],
                out_dir: Path) -> list[str]:
    """Write every plot of the labelled group rows, concurrency rows and requests'
    latencies (analysis/figures.py); return their paths relative to out_dir."""
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    per_category = [r for r in rows if r["category"] != "all"]
    jobs = [("speedup_vs_k.png", lambda p: plot_speedup_vs_k(per_category, p)),
            ("per_position_acceptance.png", lambda p: plot_per_position(rows, p)),
            ("latency_cdf.png", lambda p: plot_latency_cdf(latencies, p))]
    if concurrency:
        jobs.append(("concurrency.png", lambda p: plot_concurrency(concurrency, p)))
    for name, fn in jobs:
        fn(plot_dir / name)
    return [f"plots/{name}" for name, _ in jobs]
