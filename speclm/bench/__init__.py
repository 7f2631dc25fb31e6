"""`speclm bench`: interleaved, reproducible benchmarks of speculative methods
against plain decoding, per prompt category.

    from speclm.bench import BenchConfig, load_builtin, plan_bench, run_pipeline
    plan = plan_bench(load_builtin(["code-edit"], 5), BenchConfig(ks=[4]), llm)
    out = run_pipeline(plan, Path("bench-out/x"))

One pipeline of stages, plan → run → trust → analyse → write (pipeline.py); by
what each part does (docs/bench.md):
- setup/     the plan: the methods, the workloads, the config and its arms, the models;
- run/       the timed requests (sequential, concurrent), traces, records, the models'
             turns, the sweep over them, the manifest;
- trust/     what makes a figure believable: a quiet machine, starved requests flagged and
             re-run, prompts no phase has sent before, N never above a row's prompts;
- analysis/  the figures, pure functions of the records;
- output/    the report as one list of sections, rendered to summary.json, report.md and
             the console; the plots;
- endpoint/  the same prompts against running OpenAI-compatible servers.

The command line is speclm/commands/bench.py.
New methods: one record in the method table (speclm.speculative.methods.register).
"""

from .pipeline import run_pipeline
from .run.sequential import run_bench
from .setup.config import BenchConfig
from .setup.methods import BenchMethod, bench_methods
from .setup.plan import BenchPlan, plan_bench
from .setup.workloads import CATEGORIES, BenchDataError, Prompt, load_builtin, load_dataset

__all__ = ["run_pipeline", "BenchPlan", "plan_bench", "BenchMethod", "bench_methods",
           "BenchConfig", "run_bench", "CATEGORIES", "BenchDataError", "Prompt", "load_builtin",
           "load_dataset"]
