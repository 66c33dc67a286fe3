"""Full-size diffusion pipeline (examples/diffusion/models.py): encode / denoise / decode latency at
--threads (default 2) for Kiln, ONNX Runtime (CPUExecutionProvider) and PyTorch eager in one run,
as ratios, plus each process's peak RSS against the method's weights + planned arena.

    PYTHONPATH=python python bench/diffusion.py --kiln /work/big/diff/diffusion_full_xnnpack.kiln \\
        --work /work/big/diff/bench --report docs/diffusion.md

Steps (each engine and method in its own process, one at a time, so that peak RSS is per engine and
method and thread settings never leak):
1. prepare (a worker): builds the full pipeline with seeded random weights (models.build("full",
   seed)) -- the same weights export.py puts in the .kiln file for the same seed --, writes the
   inputs as .npy (token ids: random in [0, vocab); latent: N(0, 1); timestep 999; the text
   embedding that eager's encode gives for those ids) and exports each method to ONNX with
   torch.onnx.export (TorchScript exporter, dynamo=False: the dynamo exporter needs onnxscript, not
   installed; weights as external data) into --work, unless the files are there already;
2. Kiln: `kiln bench FILE --method M --threads N --input-npy ... --json` for each Kiln program given
   (--kiln, several allowed: e.g. the xnnpack program and the portable one run with cpu kernels);
3. ONNX Runtime (ORT_ENABLE_ALL, intra_op = threads, inter_op = 1, sequential) and eager
   (torch.set_num_threads, inference_mode) through this script's --worker mode.
Every engine times warm-up + --runs executions (median reported); with --rounds R the engines of a
method run R times in turn (paired rounds: each engine's figure is the median of its R medians, and
its ratio to ONNX Runtime the median of the R per-round ratios, which a shared machine's changing
load affects far less than one run per engine); every engine's output is
compared with eager's (max abs error / max |eager|). Results: a JSON file in --work and, with
--report, a Markdown section in that file between <!-- diffusion-bench --> markers. Both record the
CPU model, its SIMD features and the cpu kernel target Kiln chose (bench/machine.py, as bench/run.py;
KILN_CPU_TARGET in the environment forces one), and each Kiln row the target `kiln bench` ran at.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)
import machine  # noqa: E402  (bench/machine.py: the CPU and Kiln's cpu kernel target)


def load_models():
    """examples/diffusion/models.py (through export.py's loader: by path, module "kiln_diffusion_models")."""
    import importlib.util
    name = "kiln_diffusion_export"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", "diffusion", "export.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name].load_models()
METHODS = ("encode", "denoise", "decode")
INPUTS = {"encode": ["ids"], "denoise": ["latent", "timestep", "text"], "decode": ["latent"]}


def status_mib(field: str) -> float:
    """VmRSS / VmHWM of this process in MiB (VmHWM, not ru_maxrss, which Linux carries over exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return 0.0


class _Method:
    """pipeline.<name> as forward (for torch.onnx.export)."""

    def __new__(cls, pipe, name):
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.p = pipe

            def forward(self, *a):
                return getattr(self.p, name)(*a)
        return M()


def prepare(work: str, seed: int, methods=METHODS):
    import numpy as np
    import torch
    models = load_models()
    os.makedirs(work, exist_ok=True)
    pipe = models.build("full", seed=seed)
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, pipe.text.cfg.vocab, (1, 77), generator=g)
    latent = torch.randn(1, 4, 64, 64, generator=g)
    t = torch.tensor([999])
    with torch.inference_mode():
        text = pipe.encode(ids)
    for k, v in (("ids", ids), ("latent", latent), ("timestep", t), ("text", text)):
        np.save(os.path.join(work, f"{k}.npy"), v.numpy())
    feeds = {"ids": ids, "latent": latent, "timestep": t, "text": text}
    for m in methods:  # only the methods asked for: the UNet's ONNX export alone takes minutes
        path = os.path.join(work, f"{m}.onnx")
        if os.path.exists(path):
            continue
        t0 = time.perf_counter()
        args = tuple(feeds[k] for k in INPUTS[m])
        with torch.no_grad():
            torch.onnx.export(_Method(pipe, m), args, path, dynamo=False, opset_version=17,
                              input_names=INPUTS[m], output_names=["out"], external_data=True)
        print(f"[bench] {m}.onnx written in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def worker(engine: str, method: str, work: str, threads: int, runs: int, warmup: int, seed: int) -> dict:
    import numpy as np
    feeds = [np.load(os.path.join(work, f"{k}.npy")) for k in INPUTS[method]]
    if engine == "ort":
        import onnxruntime as ort
        base = status_mib("VmRSS")
        t0 = time.perf_counter()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sess = ort.InferenceSession(os.path.join(work, f"{method}.onnx"), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        fd = dict(zip(names, feeds))
        run = lambda: sess.run(None, fd)[0]  # noqa: E731
        note = f"onnxruntime {ort.__version__}"
    else:
        import torch
        models = load_models()
        torch.set_num_threads(threads)
        base = status_mib("VmRSS")
        t0 = time.perf_counter()
        pipe = models.build("full", seed=seed)
        # keep only the model this method uses, so that peak RSS counts its weights only
        for sub, user in (("text", "encode"), ("unet", "denoise"), ("decoder", "decode")):
            if user != method:
                setattr(pipe, sub, None)
        import gc
        gc.collect()
        tf = [torch.from_numpy(f) for f in feeds]

        def run():
            with torch.inference_mode():
                return getattr(pipe, method)(*tf).numpy()
        note = f"torch {torch.__version__} eager, inference_mode, {torch.get_num_threads()} threads"
    load_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(warmup):
        y = run()
    times = []
    for _ in range(runs):
        s = time.perf_counter()
        y = run()
        times.append((time.perf_counter() - s) * 1e3)
    np.save(os.path.join(work, f"out_{engine}_{method}.npy"), np.asarray(y, np.float32))
    st = sorted(times)
    return {"engine": engine, "method": method, "median_ms": st[len(st) // 2] if len(st) % 2 else
            0.5 * (st[len(st) // 2 - 1] + st[len(st) // 2]), "times_ms": times, "load_ms": load_ms,
            "peak_rss_mib": status_mib("VmHWM"), "base_rss_mib": base, "note": note}


def kiln_label(path: str, kernels: str) -> str:
    """"Kiln: <kernels> kernels[ + <delegates>]" from the program's delegate segments (kiln inspect)."""
    p = subprocess.run([os.path.join(ROOT, "build", "tools", "kiln"), "inspect", path, "--json"], capture_output=True,
                       text=True)
    dele = set()
    if p.returncode == 0:
        for m in json.loads(p.stdout)["methods"]:
            dele |= set(m.get("delegate_segments", {}))
    return f"Kiln {kernels} kernels" + "".join(f" + {d}" for d in sorted(dele)) + ("" if dele else " (no delegate)")


def run_kiln(kiln_bin: str, path: str, method: str, work: str, threads: int, runs: int, warmup: int,
             kernels: str, with_output: bool = True) -> dict:
    inputs = []
    for k in INPUTS[method]:
        inputs += ["--input-npy", os.path.join(work, f"{k}.npy")]
    cmd = [kiln_bin, "bench", path, "--method", method, "--threads", str(threads), "--runs", str(runs),
           "--warmup", str(warmup), "--kernels", kernels, "--json", *inputs]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()[-2000:]}")
    r = json.loads(p.stdout)
    if not with_output:
        return r
    # the output, for the error vs eager: `kiln run` writes it (output_0.npy)
    out_dir = os.path.join(work, f"out_kiln_{os.path.basename(path)}_{kernels}_{method}")
    cmd = [kiln_bin, "run", path, "--method", method, "--threads", str(threads), "--kernels", kernels,
           "--output-dir", out_dir, "--numbered"] + [x for k in INPUTS[method] for x in ("--input", os.path.join(work, f"{k}.npy"))]
    q = subprocess.run(cmd, capture_output=True, text=True)
    r["output"] = os.path.join(out_dir, "output_0.npy") if q.returncode == 0 else None
    if q.returncode != 0:
        r["output_error"] = q.stderr.strip()[-300:]
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln", nargs="*", default=[], metavar="FILE.kiln[:portable]",
                   help="Kiln programs to time (export.py --size full); ':portable' runs the portable kernels")
    p.add_argument("--work", default="/work/big/diff/bench", help="inputs, ONNX files, outputs, results.json")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", nargs=3, type=int, default=[5, 3, 3], metavar=("ENCODE", "DENOISE", "DECODE"),
                   help="timed runs per method (after 1 warm-up)")
    p.add_argument("--engines", nargs="+", default=["kiln", "ort", "eager"])
    p.add_argument("--rounds", type=int, default=1,
                   help="paired rounds: every engine of a method runs once per round, rounds one after another; "
                        "the table gives each engine's median over its rounds' medians and, against ONNX Runtime, "
                        "the median of the rounds' ratios (a change of the machine's load between rounds cancels)")
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--seed", type=int, default=0, help="weights seed (as export.py --seed)")
    p.add_argument("--kiln-bin", default=os.path.join(ROOT, "build", "tools", "kiln"))
    p.add_argument("--report", metavar="FILE.md")
    p.add_argument("--report-only", action="store_true", help="rewrite --report from --work/results.json")
    p.add_argument("--results", help="with --report-only: the results JSON to read (default --work/results.json)")
    p.add_argument("--tag", default="", help="section tag: the table goes between <!-- diffusion-bench[:TAG] --> markers")
    p.add_argument("--worker", nargs=2, metavar=("ENGINE", "METHOD"), help=argparse.SUPPRESS)
    p.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    runs = dict(zip(METHODS, a.runs))

    if a.prepare:
        prepare(a.work, a.seed, a.methods)
        return 0
    if a.worker:
        e, m = a.worker
        print(json.dumps(worker(e, m, a.work, a.threads, runs[m], 1, a.seed)))
        return 0

    res_path = os.path.join(a.work, "results.json")
    if a.report_only:
        with open(a.results or res_path) as f:
            results = json.load(f)
        add_errors(results)
        write_report(a.report, results, a)
        return 0
    os.makedirs(a.work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    if not all(os.path.exists(os.path.join(a.work, f)) for f in ["ids.npy", "text.npy"] +
               [f"{m}.onnx" for m in a.methods] * ("ort" in a.engines)):
        print("[bench] preparing inputs and ONNX files ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, __file__, "--prepare", "--work", a.work, "--seed", str(a.seed), "--methods",
                        *a.methods], check=True, env=env)
    # Results of earlier runs for other methods/engines are kept (re-run a part with --methods/--engines).
    cpu = machine.cpu_description()
    print(f"[bench] cpu: {machine.cpu_summary(cpu)}", file=sys.stderr, flush=True)
    results = []
    if os.path.exists(res_path):
        with open(res_path) as f:
            new_files = {spec.partition(":")[0] for spec in a.kiln}
            results = [r for r in json.load(f) if not (r["method"] in a.methods and r["engine"] in a.engines and (
                r["engine"] != "kiln" or r.get("file") in new_files))]
    for m in a.methods:
        rounds: dict = {}  # (engine, spec) -> that engine's result of every round
        for k, e, spec in [(k, e, s) for k in range(max(1, a.rounds)) for e in a.engines
                           for s in (a.kiln if e == "kiln" else [None])]:
            t0 = time.perf_counter()
            try:
                if e == "kiln":
                    path, _, kern = spec.partition(":")
                    r = run_kiln(a.kiln_bin, path, m, a.work, a.threads, runs[m], 1, kern or "cpu", with_output=k == 0)
                    r.update(engine="kiln", method=m, label=kiln_label(path, kern or "cpu"))
                else:
                    q = subprocess.run([sys.executable, __file__, "--worker", e, m, "--work", a.work, "--threads",
                                        str(a.threads), "--runs", *map(str, a.runs), "--seed", str(a.seed)],
                                       capture_output=True, text=True, env=env)
                    if q.returncode != 0:
                        raise RuntimeError(q.stderr.strip()[-1500:])
                    r = json.loads(q.stdout.strip().splitlines()[-1])
                    r["label"] = {"ort": "ONNX Runtime", "eager": "PyTorch eager"}[e]
                    r["output"] = os.path.join(a.work, f"out_{e}_{m}.npy")
            except Exception as ex:  # noqa: BLE001
                r = {"engine": e, "method": m, "label": e if spec is None else spec, "error": str(ex)}
            print(f"[bench] {m} {r['label']}" + (f" round {k + 1}/{a.rounds}" if a.rounds > 1 else "") + ": " +
                  (f"median {r['median_ms']:.1f} ms, peak RSS {r['peak_rss_mib']:.0f} MiB" if "error" not in r
                   else f"FAILED {r['error'][-300:]}") + f" ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
            r["cpu"] = cpu
            rounds.setdefault((e, spec), []).append(r)
        for rs in rounds.values():
            results.append(merge_rounds(rs))
        with open(res_path, "w") as f:
            json.dump(results, f, indent=1)
    add_errors(results)
    with open(res_path, "w") as f:
        json.dump(results, f, indent=1)
    if a.report:
        write_report(a.report, results, a)
    return 0


def merge_rounds(rs: list) -> dict:
    """One engine's results of several paired rounds as one: median_ms the median of the rounds'
    medians (their list in round_medians), times_ms all timed runs, peak RSS the largest; an error in
    any round makes the whole an error."""
    import statistics
    bad = next((r for r in rs if "error" in r), None)
    if bad is not None or len(rs) == 1:
        return bad if bad is not None else rs[0]
    r = dict(rs[0])  # the first round's also has the output (the error vs eager)
    r["round_medians"] = [x["median_ms"] for x in rs]
    r["median_ms"] = statistics.median(r["round_medians"])
    r["times_ms"] = [t for x in rs for t in x["times_ms"]]
    r["peak_rss_mib"] = max(x["peak_rss_mib"] for x in rs)
    return r


def add_errors(results):
    import numpy as np
    for m in METHODS:
        ref = next((r for r in results if r["method"] == m and r["engine"] == "eager" and "error" not in r), None)
        if ref is None:
            continue
        e = np.load(ref["output"])
        for r in results:
            if r["method"] == m and r.get("output") and "error" not in r:
                y = np.load(r["output"])
                r["rel_error"] = float(np.abs(y - e).max() / np.abs(e).max()) if y.shape == e.shape else None


def kiln_sizes(kiln_bin: str, path: str) -> dict:
    p = subprocess.run([kiln_bin, "inspect", path, "--json"], capture_output=True, text=True)
    return {m["name"]: m for m in json.loads(p.stdout)["methods"]} if p.returncode == 0 else {}


def write_report(path: str, results, a):
    import datetime
    rows = ["| method | engine | median ms (runs) | vs ONNX Runtime | vs eager | peak RSS MiB | weights + arena MiB | "
            "max error vs eager |", "|---|---|---|---|---|---|---|---|"]
    sizes = {}
    models = load_models()
    import torch
    with torch.device("meta"):
        pipe = models.Pipeline("full")
    wbytes = {"encode": models.count(pipe.text) * 4, "denoise": models.count(pipe.unet) * 4 + 8000,
              "decode": models.count(pipe.decoder) * 4}
    for m in METHODS:
        base = {r["engine"]: r for r in results if r["method"] == m and "error" not in r and r["engine"] != "kiln"}
        order = {"kiln": 0, "ort": 1, "eager": 2}
        for r in sorted((r for r in results if r["method"] == m), key=lambda r: order.get(r["engine"], 3)):
            if "error" in r:
                rows.append(f"| {m} | {r['label']} | failed: {r['error'][-120:]} | | | | | |")
                continue
            def ratio(k, r=r):
                if k not in base:
                    return "-"
                a_, b_ = r.get("round_medians"), base[k].get("round_medians")
                if a_ and b_ and len(a_) == len(b_):  # paired rounds: the median of the rounds' ratios
                    q = sorted(x / y for x, y in zip(a_, b_))
                    return f"{q[len(q) // 2] if len(q) % 2 else (q[len(q) // 2 - 1] + q[len(q) // 2]) / 2:.2f}x " \
                           f"[{q[0]:.2f}-{q[-1]:.2f}]"
                return f"{r['median_ms'] / base[k]['median_ms']:.2f}x"
            wa = "-"
            if r["engine"] == "kiln":
                f = r["file"]
                if f not in sizes:
                    sizes[f] = kiln_sizes(a.kiln_bin, f)
                info = sizes[f].get(m, {})
                wa = f"{(wbytes[m] + info.get('arena_bytes', 0)) / 2**20:.0f}"
            err = r.get("rel_error")
            if r["engine"] == "kiln":
                r["label"] = kiln_label(r["file"], r.get("kernels", "cpu"))
                if r.get("cpu_target") and r.get("kernels", "cpu") == "cpu":
                    r["label"] += f" [cpu target {r['cpu_target']}]"
            rows.append(f"| {m} | {r['label']} | {r['median_ms']:.1f} ({len(r['times_ms'])}) | {ratio('ort')} | {ratio('eager')} | "
                        f"{r['peak_rss_mib']:.0f} | {wa} | {'-' if err is None else f'{err:.1e}'} |")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpus = list(dict.fromkeys(machine.cpu_summary(r["cpu"]) for r in results if r.get("cpu")))
    where = (". Machine: " + " | ".join(cpus)) if cpus else ""
    b, e = (f"<!-- diffusion-bench{':' + a.tag if a.tag else ''} -->",
            f"<!-- /diffusion-bench{':' + a.tag if a.tag else ''} -->")
    body = (f"{b}\n`python bench/diffusion.py` (table written {when}; {a.threads} threads; "
            "median of (runs) timed runs after 1 warm-up"
            + ("; with paired rounds: the median over the rounds' medians, and against ONNX Runtime the median "
               "[min-max] of the rounds' ratios" if any(r.get("round_medians") for r in results) else "")
            + "; weights: the fp32 parameters of the method's model; "
            "arena: the method's planned arena from `kiln inspect`; error: max abs difference from eager's "
            f"output / max |eager output|){where}:\n\n"
            + "\n".join(rows) + f"\n{e}")
    text = open(path).read() if os.path.exists(path) else "# Diffusion pipeline\n"
    if b in text and e in text:
        text = text[:text.index(b)] + body + text[text.index(e) + len(e):]
    else:
        text = text.rstrip("\n") + "\n\n## Benchmark (full size)\n\n" + body + "\n"
    with open(path, "w") as f:
        f.write(text)
    print(f"[bench] results written to {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
