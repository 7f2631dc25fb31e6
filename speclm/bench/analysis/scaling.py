"""Concurrency rows paired within a repeat (bench --concurrency-repeats R).

The machine's speed drifts (±15–20 % within an hour on the shared 2-core hosts), so a
ratio of two rows is trusted only when the rows ran next to each other. For every
(T, N, config) this gives, over the R repeats:

- tok_s        the row's throughput: p50 (median) [min–max];
- vs_ar        its throughput / AR's at the same N in the same repeat (the rows run
               back to back, their order flipping between repeats): median [min–max],
               and in how many repeats it was below 1;
- vs_ar_1      its throughput / AR's at N = 1 in the same repeat (the batching gain);
               None without an N = 1 row.

Rows are matched on (temperature, repeat, the N asked for) and, in a variant sweep, the
target they ran on (a row with fewer prompts than the N asked keeps only as many in
flight: trust/phases.py; "concurrency" is that N); a starved row (trust/starvation.py) makes its pairs unreliable and is
counted in `starved`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ..setup.methods import BASELINE
from .distributions import distribution
from .groups import labelled, models_vary

MODEL_KEYS = ("target", "draft", "target_name", "draft_name")


def _spread(xs: Sequence[float]) -> dict | None:
    """The bench's distribution of xs (p50 = median), None for no values."""
    return distribution(xs) if xs else None


def asked(row: dict) -> int:
    """The N a concurrency row was asked for (--concurrency)."""
    return row.get("concurrency_requested") or row["concurrency"]


def paired(rows: Sequence[dict]) -> list[dict]:
    """One entry per (T, N, config, models): by T and N, AR first, then in run order (see the
    module doc); labelled as `rows` are (groups.labelled)."""
    ar = {(r["temperature"], r.get("repeat", 0), asked(r), r.get("target")): r
          for r in rows if r["method"] == BASELINE}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["temperature"], asked(r), r["method"], r.get("k"),
                *(r.get(k) for k in MODEL_KEYS))].append(r)
    out = []
    for key, rs in groups.items():
        vs_ar, vs_ar_1 = [], []
        for r in rs:
            rep, target = r.get("repeat", 0), r.get("target")
            same = ar.get((r["temperature"], rep, asked(r), target))
            single = ar.get((r["temperature"], rep, 1, target))
            if r["method"] != BASELINE and same and same["throughput_tok_s"]:
                vs_ar.append(r["throughput_tok_s"] / same["throughput_tok_s"])
            if single and single["throughput_tok_s"]:
                vs_ar_1.append(r["throughput_tok_s"] / single["throughput_tok_s"])
        first = rs[0]
        out.append({"temperature": key[0], "concurrency": first["concurrency"], "concurrency_requested": key[1],
                    "method": key[2], "k": key[3],
                    **{k: first.get(k) for k in MODEL_KEYS if k in first},
                    "repeats": len(rs), "starved": sum(1 for r in rs if r.get("starved")),
                    "tok_s": _spread([r["throughput_tok_s"] for r in rs]),
                    "vs_ar": _spread(vs_ar), "below_ar": sum(1 for x in vs_ar if x < 1.0),
                    "vs_ar_1": _spread(vs_ar_1)})
    out = labelled(out, models_vary(rows))
    return sorted(out, key=lambda e: (e["temperature"], e["concurrency_requested"], e["method"] != BASELINE))
