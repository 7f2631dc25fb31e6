"""`speclm bench`: interleaved, reproducible benchmarks of speculative methods
against plain decoding, per prompt category.

    from speclm.bench import BenchConfig, load_builtin, run_to_dir
    out = run_to_dir(llm, load_builtin(["code-edit"], 5), BenchConfig(ks=[4]), Path("bench-out/x"))

The command line is speclm/commands/bench.py.
New methods: one record in the method table (speclm.speculative.methods.register).
"""

from .setup.methods import BenchMethod, bench_methods
from .run.sequential import run_bench
from .run.sweep import run_to_dir
from .setup.config import BenchConfig
from .setup.workloads import CATEGORIES, BenchDataError, Prompt, load_builtin, load_dataset

__all__ = ["run_to_dir", "BenchMethod", "bench_methods",
           "BenchConfig", "run_bench", "CATEGORIES", "BenchDataError", "Prompt", "load_builtin",
           "load_dataset"]
