#!/usr/bin/env python3
"""LLM speed benchmark (issue 19): Kiln's `kiln generate` against llama.cpp (llama-cpp-python built
from source), PyTorch eager (transformers generate) and, when its worker is present, ExecuTorch, on
the SAME seeded random weights (nothing downloaded), at fp32, w8 and w4 (group 32). Figures, not
assertions: CI does not run it.

    PYTHONPATH=python python bench/llm.py --config llama1b --rounds 3 --report docs/llm.md --json llm.json
    PYTHONPATH=python python bench/llm.py --quick                         # smoke run, a minute or two
    PYTHONPATH=python python bench/llm.py --config llama1b --layers 2 --vocab 4096 --new-tokens 32 --rounds 1

Weights: bench/llm_models.py builds a seeded float32 LlamaForCausalLM / Qwen3ForCausalLM
(transformers' init after torch.manual_seed(--seed)) with save_pretrained; every engine's file is
made from that checkpoint: Kiln with `python -m kiln export-llm` (fp32; --quantize w8a8, int8 weights
with one scale per output channel; --quantize w4a8 --group-size 32 --scale-dtype float16; both with
int8 activation blocks of 32, as llama.cpp's Q8_0 / Q4_0 dot products and ExecuTorch's 8da8w / 8da4w
quantize activations; --kiln-weight-only: w8 / w4 with float32 activations), llama.cpp as GGUF F32 / Q8_0 / Q4_0
(bench/llm_gguf.py), eager reads the checkpoint itself (fp32 only). Files are cached under --cache, keyed by config, layers, vocab, seed, format and
the tool's version (Kiln's commit; the llama.cpp virtualenv's requirements hash).

Each run is one fresh process (so its peak RSS is its own, read with os.wait4): a prompt of
--prompt-tokens seeded random ids, then --new-tokens greedy tokens (eos never chosen). Kiln: `kiln
generate --prompt-ids ... --ignore-eos --threads T --json` (C++). Other engines are *workers*: a
script run with another virtualenv's python, printing one JSON object (see WorkerEngine). Every
engine reports time to first token (prefill of the prompt + the first token), prefill tokens/s
(prompt / time to first token) and decode tokens/s (new tokens - 1 over the time of the later steps).

Rounds: --rounds R; each round runs every engine x format at every thread count, the order of the
(engine, format) pairs rotated by one each round; before each run the script waits (up to
--idle-wait s) for the machine to be less than --idle-threshold busy. A row's figure is the median of
its rounds; the ratios Kiln / peer of tokens/s are taken per round (same format and thread count)
and their median is reported (> 1.0: Kiln is faster).

Page cache (bench/page_cache.py): a file cached in 2 MiB folios is mapped with 2 MiB pages, one in
small folios with 4 KiB pages; on the Zen 4 VM of docs/llm.md the same files prefilled up to 2x and
decoded 20-30% slower from small folios. With every engine's files together larger than memory,
files are evicted and read back between runs under memory pressure. So before each run that run's
files are evicted from the page cache, memory is compacted where writable (root), and the files are
read back with plain reads: every engine starts from its files cached, read the same way, and no
engine's timing includes the disk. The share held in 2 MiB folios is measured and reported per row.
--keep-page-cache skips this (the files stay as the previous runs left them).

Decode bandwidth limit: the read bandwidth of this machine measured at 1 and 2 threads by
bench/membw.cpp (compiled here with g++ -O3 -march=native -fopenmp: the best of 5 passes summing a
1 GiB buffer) divided by the bytes one decode step must read at least: every weight but the
embedding table at the format's smallest encoding (fp32: 32 bits, w8: 8.5 bits = int8 + a float16
scale per 32, w4: 4.5 bits) - for tied embeddings the output projection IS the embedding table, read
whole - plus one embedding row and the filled KV cache (float16, at the mean fill of the decode).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import llm_models  # noqa: E402
import page_cache  # noqa: E402
import machine  # noqa: E402

ENGINES = ["kiln", "llamacpp", "eager", "et"]
FORMATS = ["fp32", "w8", "w4"]
LABEL = {"kiln": "Kiln", "llamacpp": "llama.cpp", "eager": "PyTorch eager", "et": "ExecuTorch"}
# the smallest storage of each format, bits per weight (for the bandwidth limit)
MIN_BITS = {"fp32": 32.0, "w8": 8.5, "w4": 4.5}
GROUP = 32


def log(msg: str) -> None:
    print(f"[llm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Skip(Exception):
    """An engine (or one of its formats) that cannot run here; the message says why."""


# ---- running children ----

def run_child(cmd: list, env: dict | None = None, timeout_s: float = 3600) -> tuple[dict, float, float]:
    """Runs `cmd`, parses the last line of its stdout as JSON; returns (that object, peak RSS of the
    child in MiB (os.wait4's ru_maxrss), wall seconds). Raises RuntimeError with the tail of stderr
    when it fails."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.02)
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        o, e = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)[:300]} exited with {p.returncode}: {e.strip()[-1500:]}")
    lines = [ln for ln in o.splitlines() if ln.strip()]
    try:
        return json.loads(lines[-1]), ru.ru_maxrss / 1024.0, wall
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"{shlex.join(cmd)[:300]}: no JSON on stdout: {o[-500:]!r} {e[-500:]!r}") from None


def git(*args: str) -> str:
    r = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


# ---- engines ----

def _default_export_args(ckpt: str, fmt: str, group: int, max_seq: int, out: str) -> list:
    return ["export", "--checkpoint", ckpt, "--format", fmt, "--group-size", str(group), "--out", out]


def _default_run_args(model: str, prompt: list, prompt_file: str, new: int, threads: int, ban: str) -> list:
    return ["run", "--model", model, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(new),
            "--threads", str(threads), "--ban-ids", ban]


@dataclass
class WorkerEngine:
    """The hook for an engine run as a worker script under another virtualenv's python.

    The worker prints ONE JSON object on its last stdout line for each of two subcommands (the
    argument lists come from export_args / run_args, so a worker with other flag names needs only
    those two functions):
      export (only when `exports`): -> {"file_bytes", "export_s", ...}
          default flags: export --checkpoint DIR --format fp32|w8|w4 --group-size 32 --out FILE
      run: -> {"ids": [N ints], "prefill_tokens_per_s", "decode_tokens_per_s", "time_to_first_token_ms"
               (ms), "load_s" (s), "file_bytes", optional "version", "system_info"}
          default flags: run --model FILE_OR_DIR --prompt-ids 1,2,3 --max-new-tokens N --threads T --ban-ids EOS
    Greedy, the eos ids never chosen (as kiln generate --ignore-eos), no warm-up. `setup` returns the
    python to run the worker with, or raises Skip(reason). `format_names` maps bench/llm.py's format
    to the worker's own (the report names both when they differ)."""
    name: str
    script: str                       # path relative to bench/
    formats: tuple                    # formats it runs
    setup: object                     # () -> python executable path
    exports: bool = True              # False: run gets the checkpoint folder as the model
    ext: str = ""                     # exported file suffix
    requirements: str = ""            # bench/ file whose hash keys the cached exports
    export_args: object = _default_export_args
    run_args: object = _default_run_args
    format_names: dict = field(default_factory=dict)
    version_key: str = ""             # set after setup: part of the cache key of its files
    python: str = ""


def setup_script_venv(script: str) -> str:
    """Runs bench/<script> (setup_llamacpp.sh / setup_executorch.sh: the last stdout line is the
    virtualenv) and returns <venv>/bin/python; raises Skip with the script's error."""
    path = os.path.join(HERE, script)
    if not os.path.exists(path):
        raise Skip(f"bench/{script} not found")
    log(f"setting up {script} (builds once; later runs reuse the virtualenv)")
    r = subprocess.run(["bash", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"bench/{script} failed: {r.stderr.strip()[-600:]}")
    venv = r.stdout.strip().splitlines()[-1]
    return os.path.join(venv, "bin", "python")


def _llamacpp_setup() -> str:
    return setup_script_venv("setup_llamacpp.sh")


def _et_setup() -> str:
    if not os.path.exists(os.path.join(HERE, "llm_et.py")):
        raise Skip("bench/llm_et.py (the ExecuTorch worker) is not in this checkout")
    return setup_script_venv("setup_executorch.sh")


def _eager_setup() -> str:
    r = subprocess.run([sys.executable, "-c", "import torch, transformers"], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"torch / transformers not importable in {sys.executable}: {r.stderr.strip()[-300:]}")
    return sys.executable


def _et_export_args(ckpt: str, fmt: str, group: int, max_seq: int, out: str) -> list:
    # bench/llm_et.py (ExecuTorch's own export_llama flow): w8 / w4 are its 8da8w / 8da4w schemes
    return ["export", "--checkpoint", ckpt, "--quant", ET_QUANT[fmt], "--group-size", str(group),
            "--max-seq-len", str(max_seq), "--out", out]


def _et_run_args(model: str, prompt: list, prompt_file: str, new: int, threads: int, ban: str) -> list:
    return ["run", "--pte", model, "--prompt-ids", prompt_file, "--new-tokens", str(new), "--threads", str(threads)]


# ExecuTorch's quantization schemes standing in for w8 / w4: int8 / int4 (group 32) weights with
# int8 dynamically quantized activations (XNNPACK's qd8 GEMMs), not weight-only as Kiln's and llama.cpp's
ET_QUANT = {"fp32": "fp32", "w8": "8da8w", "w4": "8da4w"}


def worker_engines() -> dict:
    return {
        "llamacpp": WorkerEngine("llamacpp", "llm_gguf.py", ("fp32", "w8", "w4"), _llamacpp_setup, ext=".gguf",
                                 requirements="requirements-llamacpp.txt",
                                 format_names={"fp32": "F32", "w8": "Q8_0", "w4": "Q4_0"}),
        "eager": WorkerEngine("eager", "llm_eager.py", ("fp32",), _eager_setup, exports=False,
                              requirements="llm_eager.py"),
        # ExecuTorch at its quantized schemes only (the issue's "8-bit and 4-bit"): its fp32 export of
        # the 1.24 B model costs about as long as a whole run; --engines et --formats fp32 is not run.
        "et": WorkerEngine("et", "llm_et.py", ("w8", "w4"), _et_setup, ext=".pte",
                           requirements="requirements-executorch.txt", export_args=_et_export_args,
                           run_args=_et_run_args, format_names=ET_QUANT),
    }


def kiln_quant_scheme(fmt: str, weight_only: bool) -> str:
    """Kiln's --quantize scheme for a bench format: w8a8 / w4a8 (int8 activations, as the peers'
    quantized formats), w8 / w4 with weight_only; fp32 stays fp32."""
    return fmt if fmt == "fp32" or weight_only else fmt + "a8"


def req_hash(name: str) -> str:
    with open(os.path.join(HERE, name), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


# ---- sizes, disk ----

def estimate_bytes(shape: dict, engine: str, fmt: str) -> int:
    """Approximate file size of one export (bytes), for the free-space check."""
    pc = llm_models.param_counts(shape)
    if engine == "checkpoint" or fmt == "fp32":
        return 4 * pc["total"]
    if engine == "kiln":  # every weight quantized, the embedding table too (shared with a tied projection)
        bits = 8.1 if fmt == "w8" else 4 + 16 / GROUP  # w8: per output channel scales; w4: float16 scales
        return int(pc["total"] * bits / 8)
    return int(pc["total"] * MIN_BITS[fmt] / 8)


def check_disk(cache: str, todo: list) -> None:
    """todo: [(label, bytes)] still to write. Exits with a clear message when the cache's file
    system has less free space than that plus 2 GiB."""
    need = sum(b for _, b in todo)
    if not need:
        return
    os.makedirs(cache, exist_ok=True)
    free = shutil.disk_usage(cache).free
    log(f"files to write: {need / 2**30:.1f} GiB ({', '.join(f'{n} {b / 2**30:.1f}' for n, b in todo)}); "
        f"free on {cache}: {free / 2**30:.1f} GiB")
    if free < need + 2 * 2**30:
        sys.exit(f"error: not enough disk space in {cache}: the exports need about {need / 2**30:.1f} GiB "
                 f"(+2 GiB margin), {free / 2**30:.1f} GiB free. Use --cache DIR elsewhere, fewer --formats / "
                 f"--engines, or --layers / --vocab to shrink the model.")


# ---- bandwidth ----

def measure_bandwidth(cache: str, threads: list) -> dict:
    """{threads: GB/s} from bench/membw.cpp (compiled into the cache), or {} with a logged reason."""
    exe = os.path.join(cache, "membw-" + req_hash("membw.cpp"))
    if not os.path.exists(exe):
        r = subprocess.run(["g++", "-O3", "-march=native", "-fopenmp", os.path.join(HERE, "membw.cpp"), "-o", exe],
                           capture_output=True, text=True)
        if r.returncode != 0:
            log(f"bandwidth probe not built: {r.stderr.strip()[-300:]}")
            return {}
    out = {}
    for t in threads:
        r = subprocess.run([exe, str(t)], capture_output=True, text=True)
        if r.returncode == 0:
            out[t] = json.loads(r.stdout)["gb_per_s"]
            log(f"read bandwidth at {t} thread(s): {out[t]:.2f} GB/s")
    return out


def decode_bytes_per_token(shape: dict, fmt: str, prompt: int, new: int) -> float:
    """The least bytes one decode step reads (see the module docstring): weights at MIN_BITS[fmt]
    plus the float16 KV cache at the mean fill (prompt + new / 2 positions)."""
    pc = llm_models.param_counts(shape)
    kv = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2 * (prompt + new / 2)
    return pc["read_per_token"] * MIN_BITS[fmt] / 8 + kv


# ---- main ----

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="llama1b", choices=[c for c in llm_models.CONFIGS if c != "quick"])
    p.add_argument("--quick", action="store_true", help="tiny shape, 16 + 16 tokens, 1 round: a smoke test")
    p.add_argument("--layers", type=int, help="cut the number of layers")
    p.add_argument("--vocab", type=int, help="replace the vocabulary size")
    p.add_argument("--engines", default="kiln,llamacpp,eager,et", help="comma-separated from " + ",".join(ENGINES))
    p.add_argument("--formats", default="fp32,w8,w4", help="comma-separated from " + ",".join(FORMATS))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3; --quick 1)")
    p.add_argument("--prompt-tokens", type=int, help="prompt length (default 128; --quick 16)")
    p.add_argument("--new-tokens", type=int, help="tokens generated (default 128; --quick 16)")
    p.add_argument("--seed", type=int, default=0, help="weights (torch.manual_seed) and prompt (numpy) seed")
    p.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "kiln", "llm-bench"))
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "tools", "kiln"))
    p.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    p.add_argument("--report", metavar="PATH", help="write the report as Markdown (e.g. docs/llm.md)")
    p.add_argument("--kiln-weight-only", action="store_true",
                   help="Kiln's w8 / w4 rows with float32 activations (weight-only: --quantize w8 / w4) instead of "
                        "the default w8a8 / w4a8 (int8 activation blocks, as the peers' quantized formats)")
    p.add_argument("--kiln-no-mmap", action="store_true",
                   help="run `kiln generate --no-mmap` (the program read into memory instead of mapped; "
                        "docs/generative.md)")
    p.add_argument("--keep-page-cache", action="store_true",
                   help="do not prepare the page cache before each run (evict the run's files, compact memory, read "
                        "them back): the files stay as the previous runs left them (see above)")
    p.add_argument("--idle-threshold", type=float, default=0.25)
    p.add_argument("--idle-wait", type=float, help="seconds to wait for an idle CPU before each run (default 10; --quick 0)")
    a = p.parse_args(argv)
    config = "quick" if a.quick else a.config
    shape = llm_models.shape_for(config, a.layers, a.vocab)
    rounds = a.rounds or (1 if a.quick else 3)
    n_prompt = a.prompt_tokens or (16 if a.quick else 128)
    n_new = a.new_tokens or (16 if a.quick else 128)
    idle_wait = a.idle_wait if a.idle_wait is not None else (0.0 if a.quick else 10.0)
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    formats = [f.strip() for f in a.formats.split(",") if f.strip()]
    for e in engines:
        if e not in ENGINES:
            p.error(f"unknown engine {e!r} (choose from {', '.join(ENGINES)})")
    for f in formats:
        if f not in FORMATS:
            p.error(f"unknown format {f!r} (choose from {', '.join(FORMATS)})")
    started = time.monotonic()
    key = f"{config}-L{shape['num_hidden_layers']}-V{shape['vocab_size']}-s{a.seed}"
    kdir = os.path.join(a.cache, key)
    os.makedirs(kdir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    pc = llm_models.param_counts(shape)
    log(f"{key}: {pc['total'] / 1e6:.1f} M parameters; prompt {n_prompt}, {n_new} new tokens, threads "
        f"{a.threads}, {rounds} round(s); cache {kdir}")

    # engines: set up, or skipped with the reason
    skipped = {}
    workers = worker_engines()
    kiln_version = git("rev-parse", "--short=12", "HEAD")
    if "kiln" in engines and not os.access(a.cli, os.X_OK):
        skipped["kiln"] = f"{a.cli} not built (cmake --build build)"
    for e in engines:
        if e in workers:
            w = workers[e]
            try:
                w.python = w.setup()
                w.version_key = req_hash(w.requirements)
            except Skip as s:
                skipped[e] = str(s)
                log(f"{LABEL[e]}: skipped: {s}")
    active = [e for e in engines if e not in skipped]

    # files: checkpoint, then every engine x format export (cached)
    ckpt = os.path.join(kdir, "hf")
    files, exports, todo = {}, {}, []
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        todo.append(("checkpoint", estimate_bytes(shape, "checkpoint", "fp32")))

    def out_path(e: str, f: str) -> str:
        if e == "kiln":
            # the KV cache capacity is part of a Kiln program: prompt + new tokens
            return os.path.join(kdir, f"kiln-{kiln_version}-{kiln_scheme(f)}{'-g%d' % GROUP if f == 'w4' else ''}"
                                      f"-ctx{n_prompt + n_new}.kiln")
        w = workers[e]
        return ckpt if not w.exports else os.path.join(
            kdir, f"{e}-{w.version_key}-{f}-g{GROUP}-ctx{n_prompt + n_new}{w.ext}")

    def kiln_scheme(f: str) -> str:
        return kiln_quant_scheme(f, a.kiln_weight_only)

    pairs = []  # (engine, format) to run
    for e in active:
        for f in formats:
            if e in workers and f not in workers[e].formats:
                continue
            pairs.append((e, f))
            path = out_path(e, f)
            if path != ckpt and not os.path.exists(path):
                todo.append((f"{e}/{f}", estimate_bytes(shape, e, f)))
    check_disk(a.cache, todo)
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        log(f"building the seeded checkpoint ({pc['total'] / 1e6:.0f} M parameters)")
        t0 = time.monotonic()
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import llm_models; "
                "llm_models.build_checkpoint(json.loads(sys.argv[2]), sys.argv[3] + '.tmp', int(sys.argv[4])); "
                "print('{}')")
        shutil.rmtree(ckpt + ".tmp", ignore_errors=True)
        try:
            run_child([sys.executable, "-c", code, HERE, json.dumps(shape), ckpt, str(a.seed)], env=env)
        except RuntimeError as err:
            sys.exit(f"error: building the checkpoint failed: {err}")
        os.replace(ckpt + ".tmp", ckpt)
        log(f"checkpoint written in {time.monotonic() - t0:.0f} s")
    max_seq = n_prompt + n_new
    for e, f in list(pairs):
        path = out_path(e, f)
        files[(e, f)] = path
        if path == ckpt or os.path.exists(path):
            continue
        log(f"exporting {LABEL[e]} {f}")
        try:
            if e == "kiln":
                cmd = [sys.executable, "-m", "kiln", "export-llm", ckpt, "--max-seq-len", str(max_seq),
                       "-o", path + ".tmp", "-q"]
                if f == "w4":  # groups of 32 with float16 scales: 4.5 bits per weight, Q4_0's size
                    cmd += ["--quantize", kiln_scheme(f), "--group-size", str(GROUP), "--scale-dtype", "float16"]
                elif f == "w8":  # Kiln's w8 is symmetric with one scale per output channel (no groups)
                    cmd += ["--quantize", kiln_scheme(f)]
                rss, wall = _run_plain(cmd, env)
                os.replace(path + ".tmp", path)
            else:
                w = workers[e]
                part = path[:len(path) - len(w.ext)] + ".part" + w.ext  # the worker may insist on its suffix
                _, rss, wall = run_child([w.python, os.path.join(HERE, w.script),
                                          *w.export_args(ckpt, f, GROUP, max_seq, part)], env=env)
                os.replace(part, path)
            exports[(e, f)] = {"export_s": wall, "export_peak_rss_mib": rss}
            log(f"exported {LABEL[e]} {f}: {os.path.getsize(path) / 2**20:.1f} MiB in {wall:.0f} s "
                f"(peak RSS {rss:.0f} MiB)")
        except RuntimeError as err:
            log(f"{LABEL[e]} {f}: export failed: {err}")
            skipped[f"{e}/{f}"] = f"export failed: {str(err)[-400:]}"
            pairs.remove((e, f))

    bw = measure_bandwidth(a.cache, a.threads)

    rng = np.random.default_rng(a.seed)
    special = {shape["bos_token_id"], shape["eos_token_id"]}
    prompt = [int(x) for x in rng.integers(3, shape["vocab_size"], size=n_prompt * 2) if int(x) not in special][:n_prompt]
    ban = str(shape["eos_token_id"])
    prompt_file = os.path.join(kdir, f"prompt-{n_prompt}.json")
    with open(prompt_file, "w") as fh:
        json.dump(prompt, fh)
    compacted = None
    results = {}  # (e, f, t) -> [per-round dict]
    busy = []
    for r in range(rounds):
        order = pairs[r % len(pairs):] + pairs[:r % len(pairs)] if pairs else []
        for t in a.threads:
            for e, f in order:
                model_files = page_cache.engine_file_paths(files[(e, f)])
                if not a.keep_page_cache:
                    compacted = page_cache.prepare(model_files)
                    if not compacted and r == 0 and t == a.threads[0] and (e, f) == order[0]:
                        log("page cache: memory not compacted (/proc/sys/vm/compact_memory is not writable)")
                huge = page_cache.huge_folio_share_of(model_files)
                busy.append(machine.wait_idle(a.idle_threshold, idle_wait))
                if e == "kiln":
                    cmd = [a.cli, "generate", files[(e, f)], "--prompt-ids", ",".join(map(str, prompt)),
                           "--max-new-tokens", str(n_new), "--ignore-eos", "--threads", str(t), "--json",
                           *(["--no-mmap"] if a.kiln_no_mmap else [])]
                else:
                    w = workers[e]
                    cmd = [w.python, os.path.join(HERE, w.script),
                           *w.run_args(files[(e, f)], prompt, prompt_file, n_new, t, ban)]
                try:
                    o, rss, wall = run_child(cmd, env=dict(env, OMP_NUM_THREADS=str(t)))
                except RuntimeError as err:
                    log(f"{LABEL[e]} {f} {t}T: FAILED: {err}")
                    results.setdefault((e, f, t), []).append({"error": str(err)[-600:]})
                    continue
                o["peak_rss_mib"] = rss
                o["wall_s"] = wall
                o["huge_folio_share"] = huge
                o["busy_before"] = busy[-1]
                results.setdefault((e, f, t), []).append(o)
                log(f"round {r + 1}/{rounds} {LABEL[e]} {f} {t}T: prefill {o['prefill_tokens_per_s']:.1f} tok/s, "
                    f"decode {o['decode_tokens_per_s']:.2f} tok/s, TTFT {o['time_to_first_token_ms']:.0f} ms, "
                    f"peak RSS {rss:.0f} MiB (busy before {busy[-1]:.0%}; "
                    f"{'–' if huge is None else f'{huge:.0%}'} of the file in 2 MiB folios)")

    report = build_report(a, argv, shape, config, key, pc, n_prompt, n_new, rounds, prompt, pairs, files, exports,
                          results, skipped, bw, busy, workers, started, idle_wait, compacted)
    print(report["markdown"])
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report["data"], fh, indent=1)
        log(f"wrote {a.json}")
    if a.report:
        with open(a.report, "w") as fh:
            fh.write(report["markdown"] + "\n")
        log(f"wrote {a.report}")
    return 0


def _run_plain(cmd: list, env: dict) -> tuple[float, float]:
    """Runs a command that prints no JSON (kiln export-llm); returns (peak RSS MiB, wall s)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = p.stderr.read().decode(errors="replace")
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)[:300]} exited with {p.returncode}: {err.strip()[-1500:]}")
    return ru.ru_maxrss / 1024.0, time.monotonic() - t0


def _med(xs: list):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _f(x, spec: str = ".1f", none: str = "–") -> str:
    return none if x is None else format(x, spec)


def build_report(a, argv, shape, config, key, pc, n_prompt, n_new, rounds, prompt, pairs, files, exports, results,
                 skipped, bw, busy, workers, started, idle_wait, compacted=None) -> dict:
    """The Markdown report and the JSON data from the measurements. compacted: whether the page
    cache preparation could compact memory (None: not prepared)."""
    desc = machine.cpu_description()
    rows = []
    versions = {"kiln": f"Kiln {git('describe', '--always', '--dirty')} (Release build, `kiln generate`)"}
    system_info = None
    for (e, f) in pairs:
        size = os.path.getsize(files[(e, f)]) if os.path.isfile(files[(e, f)]) else \
            sum(os.path.getsize(os.path.join(files[(e, f)], x)) for x in os.listdir(files[(e, f)])
                if x.endswith(".safetensors"))
        for t in a.threads:
            runs = [o for o in results.get((e, f, t), []) if "error" not in o]
            errs = [o["error"] for o in results.get((e, f, t), []) if "error" in o]
            if runs and "version" in runs[0]:
                versions[e] = runs[0]["version"]
                system_info = runs[0].get("system_info") or system_info
            native = workers[e].format_names.get(f) if e in workers else \
                {"w4": f"{kiln_quant_scheme('w4', a.kiln_weight_only)} g{GROUP}",
                 "w8": f"{kiln_quant_scheme('w8', a.kiln_weight_only)} per channel"}.get(f)
            row = {"engine": e, "format": f, "native_format": native, "threads": t, "file_bytes": size,
                   "bits_per_weight": 8 * size / pc["total"], "rounds": len(runs), "errors": errs,
                   "prefill_tokens_per_s": _med([o["prefill_tokens_per_s"] for o in runs]),
                   "decode_tokens_per_s": _med([o["decode_tokens_per_s"] for o in runs]),
                   "time_to_first_token_ms": _med([o["time_to_first_token_ms"] for o in runs]),
                   "load_s": _med([o.get("load_s") for o in runs]),
                   "peak_rss_mib": max((o["peak_rss_mib"] for o in runs), default=None),
                   "ids": runs[0]["ids"] if runs else None,
                   "ids_stable_across_rounds": all(o["ids"] == runs[0]["ids"] for o in runs) if runs else None,
                   "per_round": runs}
            row.update(exports.get((e, f), {}))
            row["huge_folio_share"] = _med([o.get("huge_folio_share") for o in runs])
            lim = bw.get(t)
            row["decode_limit_tokens_per_s"] = lim * 1e9 / decode_bytes_per_token(shape, f, n_prompt, n_new) if lim else None
            row["fraction_of_limit"] = (row["decode_tokens_per_s"] / row["decode_limit_tokens_per_s"]
                                        if row["decode_tokens_per_s"] and row["decode_limit_tokens_per_s"] else None)
            rows.append(row)
    by = {(r["engine"], r["format"], r["threads"]): r for r in rows}

    # per-round ratios Kiln / peer of tokens/s (same format, thread count, round)
    ratios = []
    for r in rows:
        if r["engine"] == "kiln":
            continue
        k = by.get(("kiln", r["format"], r["threads"]))
        if not k:
            continue
        kr, pr = k["per_round"], r["per_round"]
        n = min(len(kr), len(pr))
        pre = [kr[i]["prefill_tokens_per_s"] / pr[i]["prefill_tokens_per_s"] for i in range(n)]
        dec = [kr[i]["decode_tokens_per_s"] / pr[i]["decode_tokens_per_s"] for i in range(n)
               if kr[i]["decode_tokens_per_s"] and pr[i]["decode_tokens_per_s"]]
        ratios.append({"peer": r["engine"], "format": r["format"], "threads": r["threads"],
                       "prefill_ratio": _med(pre), "decode_ratio": _med(dec), "rounds": n})

    # correctness: fp32 tokens against eager's; quantized against the same engine's fp32
    correct = []
    ref = next((r["ids"] for r in rows if r["engine"] == "eager" and r["format"] == "fp32" and r["ids"]), None)

    def lead(x, y):
        n = 0
        for i, j in zip(x, y):
            if i != j:
                break
            n += 1
        return n

    for (e, f) in pairs:
        r = next((r for r in rows if r["engine"] == e and r["format"] == f and r["ids"]), None)
        if not r:
            continue
        c = {"engine": e, "format": f, "stable_across_runs": all(
            x["ids_stable_across_rounds"] is not False for x in rows if x["engine"] == e and x["format"] == f),
            "same_ids_across_threads": len({tuple(x["ids"]) for x in rows
                                            if x["engine"] == e and x["format"] == f and x["ids"]}) == 1}
        if f == "fp32":
            c["match_eager_fp32"] = lead(r["ids"], ref) if ref is not None else None
        else:
            fp = next((x["ids"] for x in rows if x["engine"] == e and x["format"] == "fp32" and x["ids"]), None)
            if fp is not None:
                m = lead(r["ids"], fp)
                c["first_mismatch_vs_own_fp32"] = None if m == len(fp) else m
            if ref is not None:
                c["match_eager_fp32"] = lead(r["ids"], ref)
        correct.append(c)

    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmdline = "python bench/llm.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    L = []
    L.append(f"# LLM generation speed: Kiln, llama.cpp, PyTorch eager{', ExecuTorch' if 'et' in [x[0] for x in pairs] else ''}")
    L.append("")
    L.append(f"Generated by `{cmdline}` on {when} (commit {git('describe', '--always', '--dirty')}, "
             f"{(time.monotonic() - started) / 60:.1f} min). Figures, not assertions (CI does not run it).")
    L.append("")
    L.append(f"- CPU: {machine.cpu_summary(desc)}")
    L.append(f"- Engines: " + "; ".join(versions.values()))
    if system_info:
        L.append(f"- llama.cpp system_info: `{system_info}`")
    L.append(f"- Model: {config} shape ({'LlamaForCausalLM' if shape['arch'] == 'llama' else 'Qwen3ForCausalLM'}): "
             f"hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers, {shape['num_attention_heads']} "
             f"heads, {shape['num_key_value_heads']} KV heads, head_dim {shape['head_dim']}, MLP "
             f"{shape['intermediate_size']}, vocab {shape['vocab_size']}, tied embedding: "
             f"{pc['total'] / 1e6:.1f} M parameters; seeded random weights (seed {a.seed}).")
    L.append(f"- Prompt {n_prompt} seeded random ids, {n_new} new tokens, greedy (eos never chosen); {rounds} "
             f"interleaved round(s), each run a fresh process; figures are round medians. Peak RSS: the process's "
             f"(os.wait4), interpreter included for the Python workers.")
    if busy:
        L.append(f"- Shared machine: busy before the runs {min(busy):.0%}–{max(busy):.0%} (median "
                 f"{statistics.median(busy):.0%}); waited up to {idle_wait:.0f} s "
                 f"for < {a.idle_threshold:.0%} before each run.")
    if bw:
        L.append("- Read bandwidth (bench/membw.cpp, best of 5 passes over 1 GiB): " +
                 ", ".join(f"{t} thread(s) {v:.2f} GB/s" for t, v in bw.items()) +
                 ". Decode limit = bandwidth / least bytes read per token (every weight but the embedding table at "
                 "the format's smallest encoding: fp32 32, w8 8.5, w4 4.5 bits; the tied output projection is the "
                 "embedding table, read whole; one embedding row; the float16 KV cache at the mean fill).")
    L.append("- Page cache: " + ("left as the previous runs left it (--keep-page-cache)" if a.keep_page_cache else
             "before each run, that run's files evicted, memory " + ("compacted" if compacted else
             "not compacted (/proc/sys/vm/compact_memory not writable)") +
             ", the files read back in; no timing includes the disk") + ". Column 2M: the share of the file held "
             "in 2 MiB folios at the start of the run (median; bench/page_cache.py; – : not measured, e.g. a file under "
             "2 MiB; bench/llm.py's docstring says why it matters).")
    for k, v in skipped.items():
        L.append(f"- **Skipped {k}**: {v}")
    L.append("")
    L.append("| engine | format | bits/weight | file MiB | 2M | threads | prefill tok/s | decode tok/s | TTFT ms | load s | "
             "peak RSS MiB | decode limit tok/s | of limit |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        err = f" (failed: {len(r['errors'])})" if r["errors"] else ""
        fmt = r["format"] + (f" ({r['native_format']})" if r["native_format"] and r["native_format"] != r["format"] else "")
        L.append(f"| {LABEL[r['engine']]}{err} | {fmt} | {r['bits_per_weight']:.2f} | {r['file_bytes'] / 2**20:.0f} "
                 f"| {_f(r['huge_folio_share'], '.0%')} | {r['threads']} | {_f(r['prefill_tokens_per_s'])} | {_f(r['decode_tokens_per_s'], '.2f')} | "
                 f"{_f(r['time_to_first_token_ms'], '.0f')} | {_f(r['load_s'], '.2f')} | {_f(r['peak_rss_mib'], '.0f')} "
                 f"| {_f(r['decode_limit_tokens_per_s'], '.2f')} | {_f(r['fraction_of_limit'], '.0%')} |")
    L.append("")
    L.append("bits/weight = file bytes x 8 / parameters (Kiln's quantized files hold the embedding table "
             "quantized too, once when tied to the output projection; w4 uses float16 scales).")
    if ratios:
        L.append("")
        L.append("Kiln / peer, tokens/s (median of the per-round ratios; > 1.0: Kiln is faster):")
        L.append("")
        L.append("| peer | format | threads | prefill | decode |")
        L.append("|---|---|---|---|---|")
        for x in ratios:
            L.append(f"| {LABEL[x['peer']]} | {x['format']} | {x['threads']} | {_f(x['prefill_ratio'], '.2f')} | "
                     f"{_f(x['decode_ratio'], '.2f')} |")
    L.append("")
    L.append(f"Correctness (greedy tokens, {n_new} per run): fp32 rows against PyTorch eager's fp32 (matching "
             "leading tokens); quantized rows against the same engine's fp32 (first mismatching index; none = all equal).")
    L.append("")
    L.append("| engine | format | leading tokens = eager fp32 | first mismatch vs own fp32 | same tokens every round / thread count |")
    L.append("|---|---|---|---|---|")
    for c in correct:
        m = c.get("match_eager_fp32")
        fm = c.get("first_mismatch_vs_own_fp32", "n/a") if c["format"] != "fp32" else "n/a"
        L.append(f"| {LABEL[c['engine']]} | {c['format']} | {'–' if m is None else f'{m}/{n_new}'} | "
                 f"{'none' if fm is None else fm} | {'yes' if c['stable_across_runs'] else 'NO'} / "
                 f"{'yes' if c['same_ids_across_threads'] else 'NO'} |")
    md = "\n".join(L)
    data = {"command": cmdline, "date": when, "commit": git("describe", "--always", "--dirty"), "cpu": desc,
            "config": config, "shape": shape, "params": pc, "key": key, "prompt_ids": prompt,
            "prompt_tokens": n_prompt, "new_tokens": n_new, "rounds": rounds, "threads": a.threads,
            "bandwidth_gb_per_s": bw, "versions": versions, "llamacpp_system_info": system_info,
            "skipped": skipped, "rows": rows, "ratios": ratios, "correctness": correct, "busy_before": busy,
            "bytes_per_token_limit": {f: decode_bytes_per_token(shape, f, n_prompt, n_new) for f in FORMATS}}
    return {"markdown": md, "data": data}


if __name__ == "__main__":
    sys.exit(main())
