"""`speclm bench`: interleaved, reproducible benchmarks of speculative methods
against plain decoding, per prompt category.

    from speclm.bench import BenchConfig, load_builtin, run_to_dir
    out = run_to_dir(llm, load_builtin(["code-edit"], 5), BenchConfig(ks=[4]), Path("bench-out/x"))

CLI: `add_bench_parser(subparsers)` registers `speclm bench`.
New methods: one record in the method table (speclm.speculative.methods.register).
"""

from .cli import add_bench_parser, cmd_bench, run_to_dir
from .methods import BenchMethod, bench_methods
from .runner import BenchConfig, run_bench
from .workloads import CATEGORIES, BenchDataError, Prompt, load_builtin, load_dataset

__all__ = ["add_bench_parser", "cmd_bench", "run_to_dir", "BenchMethod", "bench_methods",
           "BenchConfig", "run_bench", "CATEGORIES", "BenchDataError", "Prompt", "load_builtin",
           "load_dataset"]
