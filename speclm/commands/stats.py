"""The compact stats table `speclm generate` prints after the text."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..metrics import GenerationResult
from ..speculative.identity import IdentityReport
from ..speculative.methods import get_method


def _fmt(value, spec: str = ".2f", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def stats_rows(result: GenerationResult, ar: GenerationResult | None,
               identity: IdentityReport | None, kernels=None) -> list[tuple[str, str]]:
    """kernels: the target's probe.KernelChoice (None: a backend without kernels to choose)."""
    s = result.summary
    rows = [
        ("method", "ar" if get_method(result.method).baseline else f"{result.method} (K={result.k})"),
        ("target (lossless against)", result.target),
    ]
    if kernels is not None:
        rows.append(("kernels", f"{kernels.name} ({kernels.reason})"))
    if result.draft:
        rows.append(("proposer", result.draft))
    rows += [
        ("tokens", f"{s.output_tokens} ({result.finish_reason})"),
        *([("prediction tokens accepted / rejected", f"{result.prediction.accepted} / {result.prediction.rejected}")]
          if result.prediction is not None else []),
        ("tok/s", _fmt(s.tokens_per_s)),
        ("acceptance rate", _fmt(s.acceptance_rate, ".3f")),
        ("mean acceptance length", _fmt(s.mean_acceptance_length, ".2f")),
        ("per-position acceptance", " ".join(f"{x:.2f}" for x in s.per_position_acceptance) or "-"),
        ("rounds (target forwards)", str(s.rounds)),
        ("TTFT / TPOT ms", f"{_fmt(s.ttft_ms, '.1f')} / {_fmt(s.tpot_ms, '.1f')}"),
        ("draft / verify / other ms", f"{s.draft_ms:.0f} / {s.verify_ms:.0f} / {s.other_ms:.0f}"),
    ]
    if ar is not None:
        speedup = ar.summary.wall_ms / s.wall_ms
        rows.append(("AR tok/s", _fmt(ar.summary.tokens_per_s)))
        rows.append(("speedup vs AR", f"{speedup:.2f}x" + ("" if speedup >= 1 else " (speculation lost)")))
        if identity is not None:
            rows.append((f"{identity.rule} identity with AR", identity.describe()))
        else:
            rows.append(("identity with AR", "n/a (sampling without a seed: outputs differ by design; "
                                              "distributions match)"))
    return rows


def print_stats(result: GenerationResult, ar: GenerationResult | None = None,
                identity: IdentityReport | None = None, kernels=None) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in stats_rows(result, ar, identity, kernels):
        table.add_row(key, value)
    Console(stderr=False, highlight=False).print(table)
