"""`speclm bench`: interleaved, reproducible benchmarks of speculative methods
against plain decoding, per prompt category.

    from speclm.bench import BenchConfig, load_builtin, run_to_dir
    out = run_to_dir(llm, load_builtin(["code-edit"], 5), BenchConfig(ks=[4]), Path("bench-out/x"))

By what each part does (docs/bench.md):
- setup/     what runs: the methods, the workloads, the config and its arms;
- run/       the timed requests (sequential, concurrent), traces, records, the sweep over
             models, the manifest;
- trust/     what makes a figure believable: a quiet machine, starved requests flagged and
             re-run, prompts no phase has sent before, N never above a row's prompts;
- analysis/  the figures, pure functions of the records;
- output/    the report as one list of sections, rendered to summary.json, report.md and
             the console; the plots;
- endpoint/  the same prompts against running OpenAI-compatible servers.

The command line is speclm/commands/bench.py.
New methods: one record in the method table (speclm.speculative.methods.register).
"""

from .run.sequential import run_bench
from .run.sweep import run_to_dir
from .setup.config import BenchConfig
from .setup.methods import BenchMethod, bench_methods
from .setup.workloads import CATEGORIES, BenchDataError, Prompt, load_builtin, load_dataset

__all__ = ["run_to_dir", "BenchMethod", "bench_methods",
           "BenchConfig", "run_bench", "CATEGORIES", "BenchDataError", "Prompt", "load_builtin",
           "load_dataset"]
