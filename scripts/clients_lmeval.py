"""lm-evaluation-harness's `local-completions` against a live `speclm serve`, checked
against an independent computation (docs/results.md#c59).

Runs lm-eval (from its own virtualenv: it pins its own packages) on the 48-item
multiple-choice task in scripts/lmeval_task/, with tokenized_requests=True (the default:
prompts sent as token ids) and False (strings), through a proxy that records the request
bodies. Then scores every (context, continuation) pair again with llama-cpp-python
directly: one forward over the pair's tokens with every row's logits (the server's
batch split for a prompt under its 512-row ubatch; flash attention as the server's
context resolves it, `--flash-attn`), the continuation's log-likelihood summed in float64,
and acc / acc_norm taken by argmax as lm-eval does. Prints lm-eval's scores, the
reference's, and the largest difference between their log-likelihoods.

    /work/main/.venv/bin/python scripts/clients_lmeval.py --server http://127.0.0.1:8000 \
        --lm-eval /tmp/lmeval-venv/bin/lm_eval --model qwen2.5-coder-1.5b --gguf PATH

With `--phase run` then (the server stopped) `--phase score --work DIR` only one model is
loaded at a time. Run the server with `--kernels repack+tiled` (or `repack`, then `--tiled off` here), so both
use llama.cpp's CPU_REPACK kernels the same way (llama-cpp-python's default is repack+tiled)."""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TASK_DIR = Path(__file__).resolve().parent / "lmeval_task"


def start_proxy(upstream: str, log: list) -> str:
    """A loopback HTTP proxy to `upstream` that appends each POST body (parsed) to `log`."""
    class Handler(BaseHTTPRequestHandler):
        def _forward(self, body: bytes | None) -> None:
            req = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    status, data = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, data = e.code, e.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            log.append(json.loads(body))
            self._forward(body)

        def do_GET(self) -> None:
            self._forward(None)

        def log_message(self, *args) -> None:
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def run_lm_eval(lm_eval: str, proxy: str, model: str, tokenizer: str, tokenized: bool, out: Path) -> dict:
    """One lm-eval run; returns its results JSON (scores) with the samples it logged."""
    args = (f"model={model},base_url={proxy}/v1/completions,tokenizer_backend=huggingface,"
            f"tokenizer={tokenizer},tokenized_requests={tokenized}")
    cmd = [lm_eval, "--model", "local-completions", "--model_args", args, "--tasks", "speclm_mc",
           "--include_path", str(TASK_DIR), "--output_path", str(out), "--log_samples"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=TASK_DIR, check=True)
    results = json.loads(Path(sorted(glob.glob(f"{out}/**/results_*.json", recursive=True))[-1]).read_text())
    samples = [json.loads(line) for line in
               Path(sorted(glob.glob(f"{out}/**/samples_speclm_mc_*.jsonl", recursive=True))[-1]).read_text().splitlines()]
    return {"scores": results["results"]["speclm_mc"], "samples": samples}


class Reference:
    """llama-cpp-python, straight: the pair's log-likelihood from one forward of its tokens."""

    def __init__(self, gguf: str, flash_attn: bool):
        import llama_cpp
        self.llm = llama_cpp.Llama(gguf, n_ctx=4096, n_batch=4096, n_ubatch=512, logits_all=True,
                                   flash_attn=flash_attn, verbose=False)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split: trailing spaces move to the continuation, which is the
        whole text's tokens after the context's."""
        n = len(context) - len(context.rstrip())
        if n:
            context, continuation = context[:-n], context[-n:] + continuation
        tok = lambda s: self.llm.tokenize(s.encode(), add_bos=False, special=False)
        ctx, whole = tok(context), tok(context + continuation)
        return ctx, whole[len(ctx):]

    def loglikelihood(self, ctx: list[int], cont: list[int]) -> float:
        import numpy as np
        tokens = ctx + cont
        self.llm.reset()
        self.llm.eval(tokens)
        total = 0.0
        for i in range(len(ctx), len(tokens)):
            row = np.asarray(self.llm.scores[i - 1], dtype=np.float64)
            m = row.max()
            total += float(row[tokens[i]] - (m + math.log(np.exp(row - m).sum())))
        return total


def pairs_of(sample: dict) -> list[tuple[str, str]]:
    args = sample["arguments"]
    if isinstance(args, dict):  # {"gen_args_0": {"arg_0": ctx, "arg_1": cont}, ...}
        args = [(a["arg_0"], a["arg_1"]) for a in args.values()]
    return [tuple(a) for a in args]


def compare(name: str, run: dict, sent: list[dict], ref: Reference, tokenized: bool) -> dict:
    """Re-scores every sample and prints the comparison; returns {"equal": whether lm-eval's acc and
    acc_norm equal the reference's, "worst": the largest log-likelihood difference, "matched": the
    pairs whose prompt was sent exactly as the reference rebuilds it, "pairs": all pairs}."""
    sent_prompts = {json.dumps(p) for body in sent for p in (body["prompt"] if isinstance(body["prompt"], list)
                                                              else [body["prompt"]])}
    worst, right, right_norm, matched = 0.0, 0, 0, 0
    for s in run["samples"]:
        pairs = pairs_of(s)
        lls = []
        for (context, continuation), resp in zip(pairs, s["resps"]):
            ctx, cont = ref.encode_pair(context, continuation)
            what = ctx + cont if tokenized else ref.llm.detokenize(ctx + cont).decode()
            matched += json.dumps(what) in sent_prompts
            ll = ref.loglikelihood(ctx, cont)
            worst = max(worst, abs(ll - float(resp[0][0])))
            lls.append(ll)
        choices = [c for _, c in pairs]
        target = int(s["target"])
        right += max(range(len(lls)), key=lambda i: lls[i]) == target
        normed = [ll / len(c.lstrip(" ")) for ll, c in zip(lls, choices)]
        right_norm += max(range(len(lls)), key=lambda i: normed[i]) == target
    n = len(run["samples"])
    got = run["scores"]
    print(f"{name}: {n} items, {len(sent)} requests; prompts the reference rebuilt exactly as sent: "
          f"{matched}/{sum(len(pairs_of(s)) for s in run['samples'])}")
    print(f"  lm-eval   acc {got['acc,none']:.4f}  acc_norm {got['acc_norm,none']:.4f}")
    print(f"  reference acc {right / n:.4f}  acc_norm {right_norm / n:.4f}")
    print(f"  max |loglik(lm-eval) - loglik(reference)| = {worst:.3g}", flush=True)
    pairs = sum(len(pairs_of(s)) for s in run["samples"])
    return {"equal": math.isclose(got["acc,none"], right / n) and math.isclose(got["acc_norm,none"], right_norm / n),
            "worst": worst, "matched": matched, "pairs": pairs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--lm-eval", default="/tmp/lmeval-venv/bin/lm_eval")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="the served model id")
    ap.add_argument("--gguf", required=True, help="the served target's GGUF (`speclm models path NAME`)")
    ap.add_argument("--tokenizer", help="a Hugging Face tokenizer directory (default: written from the GGUF "
                                        "by scripts/gguf_tokenizer.py in lm-eval's virtualenv)")
    ap.add_argument("--flash-attn", choices=("on", "off"), default="on")
    ap.add_argument("--tiled", choices=("on", "off"), default="on", help="GGML_CPU_TILED_MM, as the server's kernels")
    ap.add_argument("--modes", default="tokens,strings")
    ap.add_argument("--phase", choices=("all", "run", "score"), default="all",
                    help="run: lm-eval only, saving its samples and the bodies it sent in --work; score: the "
                         "reference over a --work that `run` filled (stop the server first: one model at a time)")
    ap.add_argument("--work", help="the folder runs are saved in (default: a new temporary one)")
    args = ap.parse_args()
    if args.phase == "score" and not args.work:
        ap.error("--phase score needs the --work folder that --phase run filled")
    os.environ["GGML_CPU_TILED_MM"] = "1" if args.tiled == "on" else "0"
    work = Path(args.work or tempfile.mkdtemp(prefix="speclm-lmeval-"))
    work.mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    if args.phase != "score":
        tokenizer = args.tokenizer or str(work / "tokenizer")
        if not args.tokenizer:  # the GGUF's own vocabulary (scripts/gguf_tokenizer.py)
            py = str(Path(args.lm_eval).parent / "python")
            subprocess.run([py, str(Path(__file__).parent / "gguf_tokenizer.py"), args.gguf, tokenizer], check=True)
        for mode in modes:
            log: list = []
            proxy = start_proxy(args.server, log)
            run = run_lm_eval(args.lm_eval, proxy, args.model, tokenizer, mode == "tokens", work / mode)
            (work / f"{mode}.json").write_text(json.dumps({"run": run, "sent": log}))
        print(f"saved in {work}", flush=True)
    if args.phase == "run":
        return
    ref, ok = Reference(args.gguf, args.flash_attn == "on"), True
    for mode in modes:
        saved = json.loads((work / f"{mode}.json").read_text())
        ok &= compare(f"tokenized_requests={mode == 'tokens'}", saved["run"], saved["sent"], ref,
                      mode == "tokens")["equal"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
