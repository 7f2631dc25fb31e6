"""`speclm heads train|info`: Medusa heads for a target model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..backends.load import LoadConfig
from ..errors import InvalidRequestError
from ..heads.train import TrainConfig
from .flags import add_options, build


def add_heads_parser(sub) -> None:
    h = sub.add_parser("heads", help="Medusa heads: train them for a target, or show a heads file")
    hs = h.add_subparsers(dest="heads_command", required=True)
    t = hs.add_parser("train", help="self-distil Medusa heads from the target (resumable, time-bounded)",
                      description="Train Medusa heads on the target's own predictions over Python standard-"
                                  "library source and installed packages' documentation (never bench "
                                  "prompts). Rerunning continues where the last run stopped.")
    add_options(t, LoadConfig, "models", skip=("draft", "n_ctx"))
    add_options(t, TrainConfig, "training")
    t.add_argument("--out", default=None, help="heads file (default: the model cache, where medusa finds it)")
    t.add_argument("--restart", action="store_true", help="discard collected data and training state first")
    t.set_defaults(func=cmd_heads_train)
    i = hs.add_parser("info", help="show a heads file (checked against its sha256)")
    i.add_argument("path", nargs="?", default=None, help="heads file (default: the default target's)")
    i.set_defaults(func=cmd_heads_info)


def cmd_heads_train(args: argparse.Namespace) -> int:
    import shutil

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..backends.load import load_backend
    from ..models.registry import DEFAULT_TARGET
    from ..heads.file import default_heads_path, target_sha256
    from ..heads.train import WorkDir, train
    cfg, load = build(args, TrainConfig), build(args, LoadConfig)
    backend = load_backend(load.target or DEFAULT_TARGET, load.n_ctx, load.n_threads, 1, load.kernels)
    try:
        sha = target_sha256(backend.path)
        out = Path(args.out) if args.out else default_heads_path(sha)
        work = WorkDir(default_heads_path(sha).with_name(f"work-{sha[:16]}-k{cfg.n_heads}-v{cfg.vocab}"))
        if args.restart:
            shutil.rmtree(work.root)
            work = WorkDir(work.root)
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TextColumn("{task.fields[note]}"), TimeElapsedColumn()) as bar:
            tasks: dict[str, int] = {}

            def progress(phase: str, done: int, total: int, note: str) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(phase, total=total, note="")
                bar.update(tasks[phase], completed=min(done, total), total=total, note=note)

            report = train(backend, backend.path, sha, out, work, cfg, progress=progress)
    finally:
        backend.close()
    print(json.dumps(report, indent=1))
    for row in report["after"]:
        print(f"head {row['head']}: top-1 accuracy {row['accuracy']:.3f} on held-out text "
              f"(unigram baseline {row['unigram']:.3f})")
    print(f"wrote {report['path']} (sha256 {report['sha256'][:16]}…)")
    return 0


def cmd_heads_info(args: argparse.Namespace) -> int:
    from ..models.catalog import resolve_model
    from ..models.registry import DEFAULT_TARGET
    from ..heads.file import find_heads, read_heads_meta, target_sha256
    path = Path(args.path) if args.path else find_heads(target_sha256(resolve_model(DEFAULT_TARGET)))
    if path is None:
        raise InvalidRequestError("no heads trained for the default target: `speclm heads train`")
    print(json.dumps({"path": str(path), **read_heads_meta(path)}, indent=1))
    return 0
