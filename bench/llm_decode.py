#!/usr/bin/env python3
"""Decode-step time against KV-cache capacity (issue 18): a decode step must not grow with the cache.

A 2-layer LlamaForCausalLM with Llama-3.2-1B-shaped layers (hidden 2048, 32 heads, 8 KV heads,
head_dim 64, MLP 8192; vocab 2048 instead of 128256 to keep the files small, so the lm_head is
16 MiB instead of 1 GiB; seeded random weights, ``save_pretrained`` into a temporary folder) is
exported with ``kiln.export_llm`` twice, with max_seq_len 512 and with 4096. For each program and
thread count (1 and 2), in interleaved rounds (so that load from other processes on a shared machine
hits both programs alike; before each measurement the script waits, up to --idle-wait seconds, for
the machine to be less than --idle-threshold busy):
- py: ``program.method().execute`` on a session (the C++ runtime; the Python call costs ~0.1 ms
  against a step of ~20 ms): reset, a prefill of 64 tokens at position 0, then --steps decode steps
  (one token per call, positions 64, 65, ...; each step's token is the greedy choice of the previous
  one), each step timed alone;
- bench: ``build/tools/kiln bench FILE -i <one token> -i <position 64> --runs --steps --json``
  (one decode step's work, repeated; min and median in C++);
- generate: ``build/tools/kiln generate FILE --prompt-ids <64 ids> --max-new-tokens --steps
  --ignore-eos --threads T --json`` (decode_tokens_per_s and prefill_tokens_per_s of the C++ runner).
The table gives, per program and thread count, milliseconds per decode step (py: the fastest step
and the lowest per-round median; bench: lowest min and lowest median over the rounds; generate:
1000 / the best decode_tokens_per_s), prefill tokens/s, and the ratio 4096/512 of each (the issue
asks for decode step times within 10% of each other).

    PYTHONPATH=python python bench/llm_decode.py [--rounds 5] [--steps 32] [--threads 1,2] [--write]
    PYTHONPATH=python python bench/llm_decode.py --quick        # smoke run, small sizes, < 1 minute

--write writes the report to docs/llm-bench.md (not with --quick). Figures, not assertions.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import kiln  # noqa: E402
import llm_models  # noqa: E402  (bench/llm_models.py)
from machine import read_cpuinfo, wait_idle  # noqa: E402  (bench/machine.py)

# Llama-3.2-1B: hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64, MLP 8192, vocab 128256,
# rope_theta 500000. Here: 2 of its layers, vocab 2048.
FULL = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, head_dim=64, intermediate_size=8192,
            num_hidden_layers=2, vocab_size=2048, caps=(512, 4096), fill=64, steps=32, rounds=5)
QUICK = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=1024,
             num_hidden_layers=2, vocab_size=512, caps=(128, 1024), fill=16, steps=16, rounds=2)

def cpu_info() -> tuple[str, str]:
    """(model, SIMD features) from /proc/cpuinfo, as scripts/test.sh prints them (bench/machine.py)."""
    try:
        with open("/proc/cpuinfo") as f:
            model, flags = read_cpuinfo(f.read())
    except OSError:
        model, flags = "", []
    return model or platform.processor() or "unknown", " ".join(flags)


def kiln_commit() -> str:
    r = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def build_checkpoint(size: dict, d: str, seed: int = 0) -> str:
    """A seeded LlamaForCausalLM of `size` (untied lm_head, rope_theta 500000) saved into `d`
    (bench/llm_models.py's build_checkpoint)."""
    s = dict(arch="llama", tie_word_embeddings=False, rope_theta=500000.0, bos_token_id=1, eos_token_id=2,
             **{k: size[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                     "intermediate_size", "num_hidden_layers", "vocab_size")})
    return llm_models.build_checkpoint(s, d, seed, max_position_embeddings=max(size["caps"]))


def time_python(prog, session, prompt: np.ndarray, steps: int) -> tuple[float, list[float]]:
    """One prefill of `prompt` at position 0 then `steps` decode steps; returns (prefill seconds,
    [decode step seconds])."""
    m = prog.method()
    session.reset()
    toks = prompt.reshape(1, -1).astype(np.int64)
    t0 = time.perf_counter()
    out = m.execute([toks, np.array([0], dtype=np.int64)], session)
    prefill_s = time.perf_counter() - t0
    tok = int(np.argmax(out[0]))
    times = []
    for i in range(steps):
        t = np.array([[tok]], dtype=np.int64)
        p = np.array([prompt.size + i], dtype=np.int64)
        t0 = time.perf_counter()
        out = m.execute([t, p], session)
        times.append(time.perf_counter() - t0)
        tok = int(np.argmax(out[0]))
    return prefill_s, times


def time_bench(cli: str, path: str, tok_npy: str, pos_npy: str, runs: int, threads: int) -> dict:
    """`kiln bench` of one decode step: one token at the position in `pos_npy`, repeated --runs times
    (on the method's own session: the same slot is rewritten each run, so every run does the work of
    one decode step at that position)."""
    out = subprocess.run([cli, "bench", path, "-i", tok_npy, "-i", pos_npy, "--threads", str(threads),
                          "--runs", str(runs), "--warmup", "3", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def time_cli(cli: str, path: str, prompt: np.ndarray, steps: int, threads: int) -> dict:
    out = subprocess.run([cli, "generate", path, "--prompt-ids", ",".join(str(int(x)) for x in prompt),
                          "--max-new-tokens", str(steps), "--ignore-eos", "--threads", str(threads), "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: small layers, caps 128/1024, 2 rounds")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 5; --quick 2)")
    p.add_argument("--steps", type=int, help="decode steps per round (default 32; --quick 16)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "tools", "kiln"))
    p.add_argument("--work", help="folder for the checkpoint and the .kiln files (default: a temporary one)")
    p.add_argument("--write", action="store_true", help="write the report to docs/llm-bench.md")
    p.add_argument("--idle-threshold", type=float, default=0.25,
                   help="before each measurement, wait for the CPU to be busy less than this fraction (default 0.25)")
    p.add_argument("--idle-wait", type=float, help="... for at most this many seconds (default 10; --quick 0)")
    a = p.parse_args(argv)
    size = dict(QUICK if a.quick else FULL)
    rounds = a.rounds or size["rounds"]
    if a.idle_wait is None:
        a.idle_wait = 0.0 if a.quick else 10.0
    steps = a.steps or size["steps"]
    threads = [int(t) for t in a.threads.split(",")]
    caps = size["caps"]
    if not os.access(a.cli, os.X_OK):
        print(f"{a.cli}: not built (cmake --build build)", file=sys.stderr)
        return 1

    model, simd = cpu_info()
    cpu_line = f"{model}, {os.cpu_count()} cores; SIMD: {simd or 'none found'}"
    print(f"cpu: {cpu_line}", flush=True)
    started = time.monotonic()
    tmp = None
    if a.work:
        work = a.work
        os.makedirs(work, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kiln-llm-bench-")
        work = tmp.name
    try:
        ckpt = build_checkpoint(size, os.path.join(work, "llama"))
        files, export_s = {}, {}
        for cap in caps:
            path = os.path.join(work, f"llama_{cap}.kiln")
            t0 = time.monotonic()
            kiln.export_llm(ckpt, cap, out=path, verbose=False)
            export_s[cap] = time.monotonic() - t0
            files[cap] = path
            print(f"exported max_seq_len {cap}: {os.path.getsize(path) / 2**20:.1f} MiB in {export_s[cap]:.0f} s",
                  flush=True)

        rng = np.random.default_rng(0)
        prompt = rng.integers(3, size["vocab_size"], size=size["fill"], dtype=np.int64)
        tok_npy, pos_npy = os.path.join(work, "decode_token.npy"), os.path.join(work, "decode_pos.npy")
        np.save(tok_npy, prompt[:1].reshape(1, 1))
        np.save(pos_npy, np.array([size["fill"]], dtype=np.int64))
        progs = {(cap, t): kiln.load(files[cap], num_threads=t) for cap in caps for t in threads}
        sessions = {k: v.new_session() for k, v in progs.items()}
        arena = {cap: progs[(cap, threads[0])].method_meta()["arena_bytes"] for cap in caps}
        state_bytes = {cap: sum(int(np.prod(s["sizes"])) * 4 for s in progs[(cap, threads[0])].states) for cap in caps}
        py = {k: {"steps": [], "round_medians": [], "prefill_tps": []} for k in progs}
        bn = {k: [] for k in progs}
        gen = {k: [] for k in progs}
        busy = []
        for r in range(rounds):
            for t in threads:
                for cap in caps:
                    k = (cap, t)
                    busy.append(wait_idle(a.idle_threshold, a.idle_wait))
                    prefill_s, times = time_python(progs[k], sessions[k], prompt, steps)
                    py[k]["steps"] += times
                    py[k]["round_medians"].append(statistics.median(times))
                    py[k]["prefill_tps"].append(prompt.size / prefill_s)
                    busy.append(wait_idle(a.idle_threshold, a.idle_wait))
                    bn[k].append(time_bench(a.cli, files[cap], tok_npy, pos_npy, steps, t))
                    busy.append(wait_idle(a.idle_threshold, a.idle_wait))
                    gen[k].append(time_cli(a.cli, files[cap], prompt, steps, t))
            print(f"round {r + 1}/{rounds} done ({time.monotonic() - started:.0f} s)", flush=True)

        rows = {}
        for k in progs:
            rows[k] = dict(
                py_min=min(py[k]["steps"]) * 1e3,
                py_med=min(py[k]["round_medians"]) * 1e3,
                bench_min=min(b["min_ms"] for b in bn[k]),
                bench_med=min(b["median_ms"] for b in bn[k]),
                gen_ms=1e3 / max(c["decode_tokens_per_s"] for c in gen[k]),
                py_prefill=max(py[k]["prefill_tps"]),
                gen_prefill=max(c["prefill_tokens_per_s"] for c in gen[k]))
        cols = [("py_min", "py min"), ("py_med", "py median"), ("bench_min", "bench min"),
                ("bench_med", "bench median"), ("gen_ms", "generate")]

        L = []
        L.append(f"- CPU: {cpu_line}")
        L.append(f"- Kiln {kiln_commit()} (Release build), cpu kernels; {platform.platform()}")
        L.append(f"- Model: LlamaForCausalLM, {size['num_hidden_layers']} layers, hidden {size['hidden_size']}, "
                 f"{size['num_attention_heads']} heads, {size['num_key_value_heads']} KV heads, head_dim "
                 f"{size['head_dim']}, MLP {size['intermediate_size']}, vocab {size['vocab_size']}"
                 + (" (Llama-3.2-1B's layer shapes; vocab 2048 instead of 128256 to keep the files small)"
                    if not a.quick else " (--quick: small sizes)")
                 + "; seeded random weights, float32")
        for cap in caps:
            L.append(f"- max_seq_len {cap}: file {os.path.getsize(files[cap]) / 2**20:.1f} MiB, KV cache (session "
                     f"state) {state_bytes[cap] / 2**20:.1f} MiB, arena {arena[cap] / 2**20:.1f} MiB (planned at "
                     f"the upper bound, seq = {cap}), export {export_s[cap]:.0f} s")
        L.append(f"- {size['fill']} positions filled (a prefill of {size['fill']} tokens at position 0), then "
                 f"{steps} decode steps (positions {size['fill']}..{size['fill'] + steps - 1}); {rounds} "
                 f"interleaved rounds (512 and 4096 alternate within each round)")
        L.append("- Milliseconds per decode step. *py*: `program.method().execute` on a session, each step timed "
                 "around the call (min: fastest step of all rounds; median: lowest per-round median). *bench*: "
                 f"`kiln bench FILE -i <one token> -i <position {size['fill']}> --runs {steps} --json` (C++; min and "
                 "lowest median over the rounds). *generate*: `kiln generate --ignore-eos --json` (C++ runner), "
                 "1000 / best decode_tokens_per_s (a mean over the steps, sampling included). Prefill: best "
                 f"tokens/s of the {size['fill']}-token prefill (py / generate).")
        L.append(f"- Shared machine: before each measurement the script waited up to {a.idle_wait:.0f} s for the "
                 f"CPU to be < {a.idle_threshold:.0%} busy; busy fraction seen then: median "
                 f"{statistics.median(busy):.0%}, max {max(busy):.0%}. The minimums are the figures to compare.")
        L.append("")
        L.append("| threads | max_seq_len | " + " | ".join(c[1] for c in cols) + " | prefill tok/s (py / generate) |")
        L.append("|---|---|" + "---|" * len(cols) + "---|")
        for t in threads:
            for cap in caps:
                x = rows[(cap, t)]
                L.append(f"| {t} | {cap} | " + " | ".join(f"{x[c]:.2f}" for c, _ in cols) +
                         f" | {x['py_prefill']:.0f} / {x['gen_prefill']:.0f} |")
            lo, hi = rows[(caps[0], t)], rows[(caps[-1], t)]
            L.append(f"| {t} | **ratio {caps[-1]}/{caps[0]}** | " +
                     " | ".join(f"**{hi[c] / lo[c]:.3f}**" for c, _ in cols) +
                     f" | {hi['py_prefill'] / lo['py_prefill']:.3f} / {hi['gen_prefill'] / lo['gen_prefill']:.3f} |")
        ratio = {c: max(rows[(caps[-1], t)][c] / rows[(caps[0], t)][c] for t in threads) for c, _ in cols}
        best = max(ratio["py_min"], ratio["bench_min"])
        L.append("")
        L.append(f"Decode step time ratio {caps[-1]}/{caps[0]} (minimums, py and bench, worst thread count): "
                 f"{best:.3f} " + ("(within 10%)" if best <= 1.10 else "(MORE than 10%)") +
                 "; of the medians and the generate means: " +
                 ", ".join(f"{n} {ratio[c]:.3f}" for c, n in cols if c not in ("py_min", "bench_min")) + ".")
        if a.quick:
            L.append("(--quick is a smoke run: steps of a fraction of a millisecond, so these ratios are mostly "
                     "timer and scheduling noise; the full run is the measurement.)")
        text = "\n".join(L)
        print()
        print(text)
        print(f"\ntotal {time.monotonic() - started:.0f} s")
        if a.write:
            if a.quick:
                print("--write ignored with --quick", file=sys.stderr)
            else:
                when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
                doc = ["# LLM decode step against KV-cache capacity", "",
                       f"Generated by `PYTHONPATH=python python bench/llm_decode.py --write` on {when} "
                       f"({(time.monotonic() - started) / 60:.1f} min). Figures, not assertions (CI does not run it). "
                       "Issue 18 asks that a decode step's time does not grow with the cache capacity: a 2-layer model "
                       "with Llama-3.2-1B-shaped layers exported with max_seq_len 512 and 4096, 64 positions filled, "
                       "decode step times within 10% of each other.", "", text, ""]
                with open(os.path.join(ROOT, "docs", "llm-bench.md"), "w") as f:
                    f.write("\n".join(doc))
                print("wrote docs/llm-bench.md")
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
