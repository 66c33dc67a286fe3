"""Kiln vs ONNX Runtime vs ExecuTorch (+XNNPACK) vs PyTorch eager on this machine: one run times
every model x engine x thread count and writes docs/benchmarks.md. Figures, not assertions: this is
not a test and CI does not run it. Start it through `bash bench/run.sh` (which builds Kiln, finds
the virtualenvs and sets up ExecuTorch's); run directly only with the paths it needs:

    python bench/run.py --kiln-cli build/tools/kiln --et-python ~/.local/share/kiln/bench-et-venv-X/bin/python

Models: torchvision mobilenet_v3_small, mobilenet_v3_large, resnet18, input 1x3x224x224 fp32, seeded
random weights (torch.manual_seed(0), BatchNorm statistics randomized too), eval mode; one input
from numpy's default_rng(0). PP-OCR (ppocr_det, ppocr_cls, ppocr_rec): the real pretrained ONNX
models shipped in rapidocr-onnxruntime (requirements-models.txt), imported by Kiln's ONNX frontend
(examples/ocr/export.py) at the static shapes of PPOCR below and run by ONNX Runtime as shipped;
Kiln's outputs are checked against ONNX Runtime's (there is no PyTorch model, so no ExecuTorch /
eager figure). With only PP-OCR models in --models, the script replaces only the PP-OCR section of
an existing --out file and keeps the rest (the torchvision tables) as it was.

Engines (each measurement in its own subprocess, so no thread setting leaks):
  kiln-portable  `kiln bench --kernels portable` on a program compiled without delegates
  kiln-cpu       `kiln bench --kernels cpu` (optimized cpu kernels where they accept a call)
  kiln-xnnpack   `kiln bench` on a program compiled with backends=("xnnpack",)
  kiln-cpu@T     with --kiln-target T (repeatable): kiln-cpu again with KILN_CPU_TARGET=T (the cpu
                 kernels at instruction set T, e.g. avx2 on an AVX-512 machine), "Kiln cpu [T]"
  ort            onnxruntime (Kiln's venv), torch.onnx.export (TorchScript exporter, opset 17),
                 ORT_ENABLE_ALL, intra_op_num_threads=N, inter_op_num_threads=1, sequential
  executorch     ExecuTorch's own venv: to_edge_transform_and_lower + XnnpackPartitioner -> .pte,
                 run with executorch.runtime; threadpool resized with _unsafe_reset_threadpool(N)
  torch          PyTorch eager, torch.set_num_threads(N), inference_mode
Kiln is timed inside the C++ runtime (`kiln bench`); the Python engines time their run call with
time.perf_counter (ORT's and ExecuTorch's Python bindings add some microseconds per call).

Timing: warm-up, then R timed runs (R >= 50 for the mobilenets; portable-kernel runs are capped by
a time budget), in --rounds interleaved rounds (every configuration once per round); a
configuration's figure is the lowest of its round medians. Before each measurement the script waits
(up to --idle-wait-s) for the other processes on the box to use less than --idle-threshold of the
CPU and records what it saw. Outputs are checked: max |logits - eager logits| per engine.

The report names the CPU model, its SIMD features (as scripts/test.sh prints them) and the cpu
kernel target Kiln chose (bench/machine.py); every Kiln measurement records the target `kiln bench`
ran at, and a kiln-cpu@T one that did not run at T is an error.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import machine  # noqa: E402  (bench/machine.py: the CPU and Kiln's cpu kernel target)

MODELS = ["mobilenet_v3_small", "mobilenet_v3_large", "resnet18"]
SHAPE = (1, 3, 224, 224)
# PP-OCR models (examples/ocr): ONNX file in the rapidocr_onnxruntime package, static input shape
# (det: a 480x640 canvas as examples/ocr/export.py's default; cls: cls_image_shape; rec: RapidOCR's
# rec_img_shape 48x320), timed runs per round.
PPOCR = {"ppocr_det": ("DET", (1, 3, 480, 640), 20), "ppocr_cls": ("CLS", (1, 3, 48, 192), 100),
         "ppocr_rec": ("REC", (1, 3, 48, 320), 30)}
PPOCR_NA = "n/a: ONNX model (no PyTorch model to lower or run)"
SECTION_BEGIN, SECTION_END = "<!-- ppocr:begin -->", "<!-- ppocr:end -->"
ENGINES = ["kiln-portable", "kiln-cpu", "kiln-xnnpack", "ort", "executorch", "torch"]
KILN_ENGINES = ENGINES[:3]  # the configurations Kiln-best is taken over (at the target Kiln chose)
LABEL = {"kiln-portable": "Kiln portable", "kiln-cpu": "Kiln cpu", "kiln-xnnpack": "Kiln xnnpack",
         "ort": "ONNX Runtime", "executorch": "ExecuTorch+XNNPACK", "torch": "PyTorch eager"}
# Names KILN_CPU_TARGET takes (include/kiln/cpu_target.h); which of them run here, Kiln says.
CPU_TARGETS = ["avx3_dl", "avx3", "avx2", "sve2", "sve", "neon", "scalar"]


def engine_list(kiln_targets: list) -> list:
    """ENGINES with "kiln-cpu@T" after "kiln-cpu" for every forced target T (--kiln-target)."""
    i = ENGINES.index("kiln-cpu") + 1
    return ENGINES[:i] + [f"kiln-cpu@{t}" for t in kiln_targets] + ENGINES[i:]


def forced_target(engine: str) -> str | None:
    """T for "kiln-cpu@T", else None."""
    return engine.partition("@")[2] or None


def base_engine(engine: str) -> str:
    """"kiln-cpu" for "kiln-cpu@T"; any other engine itself."""
    return engine.partition("@")[0]


def is_kiln(engine: str) -> bool:
    return base_engine(engine) in KILN_ENGINES


def label(engine: str) -> str:
    """The table's name of an engine: LABEL's, or "Kiln cpu [avx2]" for kiln-cpu@avx2."""
    t = forced_target(engine)
    return f"{LABEL[base_engine(engine)]} [{t}]" if t else LABEL[engine]


def cpu_engines(args) -> list:
    """kiln-cpu and its forced-target variants: the "Kiln cpu / ORT" ratio columns."""
    return ["kiln-cpu"] + [f"kiln-cpu@{t}" for t in args.kiln_target]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- machine state ----

cpu_busy, wait_idle = machine.cpu_busy, machine.wait_idle  # one implementation (bench/machine.py)


def machine_info() -> dict:
    """The machine: bench/machine.py's cpu_description() (model, cores, SIMD features, Kiln's cpu
    kernel target) plus lscpu's vCPU / thread / cache figures and the memory size."""
    info = {"platform": platform.platform()}
    info.update(machine.cpu_description())
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "L2 cache", "L3 cache"):
                info[k.strip()] = v.strip()
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        info["memory_gib"] = round(int(f.readline().split()[1]) / 1048576, 1)
    return info


def pkg_version(deb: str) -> str:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", deb], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "not installed"


def kiln_commit() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


# ---- preparing the models ----

def build_model(name: str):
    """torchvision `name` with seeded random weights, eval mode. BatchNorm statistics and affine
    parameters are randomized too (seeded): with torchvision's own init (mean 0, var 1, weight 1,
    bias 0) the mobilenets' logits are ~1e-9, too small for the output check to mean anything."""
    import torch
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    g = torch.Generator().manual_seed(1)
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            n = mod.num_features
            with torch.no_grad():
                mod.weight.copy_(torch.rand(n, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(n, generator=g) * 0.1)
                mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    return model


def kiln_inspect(cli: str, path: Path) -> dict:
    r = subprocess.run([cli, "inspect", "--json", str(path)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"kiln inspect {path}: {r.stderr.strip()}")
    return json.loads(r.stdout)["methods"][0]


def export_kiln(model, x, path: Path, backends: tuple) -> str:
    """Writes a .kiln program; returns how it was compiled. Uses kiln.export(backends=...) and,
    where this build's kiln.export does not take the backend yet, captures with kiln.capture and
    compiles with ProgramBuilder.compile(backends=...) (the same C++ compiler)."""
    import kiln
    from kiln import capture as kc
    try:
        kiln.export(model, (x,), out=str(path), backends=backends, verbose=False)
        return "kiln.export"
    except kc.ExportError as e:
        if not backends or "not built yet" not in str(e):
            raise
    cap = kc.capture(model, (x,))
    pb = kiln._kiln.ProgramBuilder()
    pb.add_method("forward", cap.graph)
    data, _ = pb.compile(backends=list(backends))
    path.write_bytes(data)
    return "kiln.capture + ProgramBuilder.compile"


def ocr_export():
    """examples/ocr/export.py as a module (models_dir, compile_onnx)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ocr_export", ROOT / "examples" / "ocr" / "export.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prepare_ppocr(args, name: str, work: Path) -> dict:
    """A PP-OCR model: the shipped .onnx (run by ORT as is), .kiln programs imported from it
    (portable/cpu and xnnpack), one input (numpy default_rng(0), uniform in [-1, 1]: the range of
    PP-OCR's normalised pixels) and ONNX Runtime's output on it as the reference."""
    import numpy as np
    import onnxruntime as ort
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    exp = ocr_export()
    attr, shape, _ = PPOCR[name]
    onnx_path = os.path.join(exp.models_dir(), getattr(exp, attr))
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    np.save(d / "x.npy", x)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    np.save(d / "eager.npy", ref)  # the reference all engines are compared with (here: ORT, 1 thread)
    p = {"dir": d, "errors": {"executorch": PPOCR_NA, "torch": PPOCR_NA}, "notes": {},
         "ref_max": float(np.max(np.abs(ref))), "onnx": onnx_path}
    for engine, file, backend in (("kiln-cpu", "model.kiln", "portable"), ("kiln-xnnpack", "model_xnnpack.kiln", "xnnpack")):
        t0 = time.perf_counter()
        try:
            summary = exp.compile_onnx(onnx_path, shape, backend, str(d / file))
            meta = kiln_inspect(args.kiln_cli, d / file)
            p["notes"][engine] = {"how": f"ONNX import (examples/ocr/export.py): {summary}",
                                  "export_s": time.perf_counter() - t0,
                                  "delegate_segments": meta.get("delegate_segments", {}),
                                  "kernel_calls": meta["num_kernel_calls"],
                                  "cpu_kernel_calls": meta.get("num_cpu_kernel_calls"),
                                  "op_counts": meta["op_counts"]}
        except Exception as e:  # noqa: BLE001 - reported in the table
            p["errors"][engine] = f"{type(e).__name__}: {e}".strip()
            if backend == "portable":
                p["errors"]["kiln-portable"] = p["errors"][engine]
        log(f"{name}: {engine} program: {p['notes'].get(engine, {}).get('how', p['errors'].get(engine))}")
    return p


def prepare(args, name: str, work: Path, et_python: str | None) -> dict:
    """Weights, input, eager reference, .kiln (portable + xnnpack), .onnx and .pte for one model."""
    if name in PPOCR:
        return prepare_ppocr(args, name, work)
    import numpy as np
    import torch
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    model = build_model(name)
    torch.save(model.state_dict(), d / "weights.pt")
    x_np = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    np.save(d / "x.npy", x_np)
    x = torch.from_numpy(x_np)
    with torch.inference_mode():
        ref = model(x).numpy()
    np.save(d / "eager.npy", ref)
    p = {"dir": d, "errors": {}, "notes": {}, "ref_max": float(np.max(np.abs(ref)))}

    for engine, file, backends in (("kiln-cpu", "model.kiln", ()), ("kiln-xnnpack", "model_xnnpack.kiln", ("xnnpack",))):
        t0 = time.perf_counter()
        try:
            how = export_kiln(model, x, d / file, backends)
            meta = kiln_inspect(args.kiln_cli, d / file)
            p["notes"][engine] = {"how": how, "export_s": time.perf_counter() - t0,
                                  "delegate_segments": meta.get("delegate_segments", {}),
                                  "kernel_calls": meta["num_kernel_calls"],
                                  "cpu_kernel_calls": meta.get("num_cpu_kernel_calls"),
                                  "op_counts": meta["op_counts"]}
            if backends and not meta.get("delegate_segments"):
                p["errors"][engine] = f"compiled with backends={backends} but the program has no delegate segment"
        except Exception as e:  # noqa: BLE001 - reported in the table
            p["errors"][engine] = f"{type(e).__name__}: {e}".strip()
            if not backends:
                p["errors"]["kiln-portable"] = p["errors"][engine]
        log(f"{name}: {engine} program: {p['notes'].get(engine, {}).get('how', p['errors'].get(engine))}")

    try:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), str(d / "model.onnx"), dynamo=False, opset_version=17,
                              input_names=["x"], output_names=["logits"])
    except Exception as e:  # noqa: BLE001
        p["errors"]["ort"] = f"torch.onnx.export: {type(e).__name__}: {e}"

    # The .pte depends only on the weights, the export script and the ExecuTorch venv: reuse it
    # when none changed (ExecuTorch's export takes a minute or more per model here).
    import hashlib
    h = hashlib.sha256((HERE / "et_export.py").read_bytes() + str(et_python).encode())
    for k, v in model.state_dict().items():
        h.update(k.encode() + v.detach().contiguous().numpy().tobytes())
    key = h.hexdigest()
    cached = d / "model.pte.json"
    if et_python is None:
        p["errors"]["executorch"] = args.et_error or "no ExecuTorch virtualenv (bench/setup_executorch.sh)"
    elif cached.is_file() and (d / "model.pte").is_file() and json.loads(cached.read_text()).get("key") == key:
        p["notes"]["executorch"] = json.loads(cached.read_text())
        log(f"{name}: executorch .pte: reused (same weights, export script and venv)")
    else:
        r = subprocess.run([et_python, str(HERE / "et_export.py"), "--model", name, "--weights", str(d / "weights.pt"),
                            "--shape", "x".join(map(str, SHAPE)), "--out", str(d / "model.pte")],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            p["errors"]["executorch"] = "export failed: " + last_error_line(r.stderr)
        else:
            p["notes"]["executorch"] = json.loads(r.stdout.strip().splitlines()[-1])
            cached.write_text(json.dumps(dict(p["notes"]["executorch"], key=key)))
            log(f"{name}: executorch .pte: {p['notes']['executorch']['delegate_calls']} delegate call(s)")
    return p


def last_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln:
            return ln.strip()[:400]
    return (lines[-1] if lines else "no output").strip()[:400]


# ---- measuring ----

def kiln_kernels(engine: str) -> str:
    return "portable" if engine == "kiln-portable" else "cpu"


def kiln_file(p: dict, engine: str) -> Path:
    return p["dir"] / ("model_xnnpack.kiln" if engine == "kiln-xnnpack" else "model.kiln")


def kiln_env(engine: str, env: dict | None = None) -> dict:
    """The environment of a Kiln process: `env` (default os.environ) with KILN_CPU_TARGET=T for
    kiln-cpu@T."""
    env = dict(os.environ if env is None else env)
    if forced_target(engine):
        env["KILN_CPU_TARGET"] = forced_target(engine)
    return env


def check_outputs(args, p: dict, engine: str, threads: int) -> tuple[float | None, float | None]:
    """Kiln: `kiln run` once; returns (max abs diff vs eager, execute ms of that run)."""
    import numpy as np
    out = p["dir"] / f"out-{engine}-{threads}"
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([args.kiln_cli, "run", str(kiln_file(p, engine)), "-i", str(p["dir"] / "x.npy"), "-o", str(out),
                        "--numbered", "--threads", str(threads), "--kernels", kiln_kernels(engine)],
                       capture_output=True, text=True, timeout=3600, env=kiln_env(engine))
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    exec_ms = None
    for line in r.stdout.splitlines():
        if line.startswith("execute:"):
            exec_ms = float(line.split()[1])
    y = np.load(out / "output_0.npy")
    return float(np.max(np.abs(y - np.load(p["dir"] / "eager.npy")))), exec_ms


def measure(args, p: dict, name: str, engine: str, threads: int, runs: int, warmup: int, et_python: str | None) -> dict:
    """One measurement in a fresh subprocess; returns the engine's JSON."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    d = p["dir"]
    if is_kiln(engine):
        env = kiln_env(engine, env)
        cmd = [args.kiln_cli, "bench", str(kiln_file(p, engine)), "--json", "--threads", str(threads),
               "--kernels", kiln_kernels(engine), "--runs", str(runs), "--warmup", str(warmup),
               "--input", str(d / "x.npy")]
    else:
        py = et_python if engine == "executorch" else sys.executable
        model = {"ort": str(p.get("onnx", d / "model.onnx")), "executorch": str(d / "model.pte"), "torch": name}[engine]
        cmd = [py, str(HERE / "worker.py"), "--engine", {"executorch": "et"}.get(engine, engine), "--model", model,
               "--weights", str(d / "weights.pt"), "--input", str(d / "x.npy"), "--threads", str(threads),
               "--runs", str(runs), "--warmup", str(warmup), "--out", str(d / f"out-{engine}-{threads}.npy")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(last_error_line(r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_all(args, preps: dict, et_python: str | None) -> dict:
    import numpy as np
    res: dict = {}
    configs = [(m, t, e) for m in args.models for t in args.threads for e in engine_list(args.kiln_target)]
    for m, t, e in configs:
        r = res.setdefault(f"{m}|{e}|{t}", {"rounds": [], "busy": [], "error": preps[m]["errors"].get(base_engine(e))})
        if r["error"] or not is_kiln(e):
            continue
        try:  # Kiln: correctness (and, for portable kernels, a first time estimate) with `kiln run`
            r["max_abs_diff"], r["run_ms"] = check_outputs(args, preps[m], e, t)
        except Exception as ex:  # noqa: BLE001
            r["error"] = f"kiln run: {ex}"
    for rnd in range(args.rounds):
        log(f"round {rnd + 1}/{args.rounds}")
        for m, t, e in configs:
            r = res[f"{m}|{e}|{t}"]
            if r["error"]:
                continue
            runs, warmup = args.runs.get(m, 50), args.warmup
            est = r.get("run_ms") or 0.0
            if base_engine(e) in ("kiln-portable", "kiln-cpu") and est * runs > args.portable_budget_s * 1e3:
                # reference kernels (where no optimized kernel took the call): ~0.5 s per run; cap
                # the runs by a time budget (never for the delegate configuration, whose first
                # run -- the estimate -- can be slow on a busy box)
                runs, warmup = int(max(3, args.portable_budget_s * 1e3 / est)), 1
            busy = wait_idle(args.idle_threshold, args.idle_wait_s)
            try:
                out = measure(args, preps[m], m, e, t, runs, warmup, et_python)
            except Exception as ex:  # noqa: BLE001
                r["error"] = f"{ex}"
                log(f"{m} {e} {t}T: FAILED: {ex}")
                continue
            if is_kiln(e):
                # the target `kiln bench` says it ran at (a kiln-cpu@T that ran elsewhere is no figure for T)
                r["cpu_target"] = out.get("cpu_target")
                if forced_target(e) and r["cpu_target"] != forced_target(e):
                    r["error"] = f"kiln bench ran at cpu target {r['cpu_target']!r}, not {forced_target(e)!r}"
                    log(f"{m} {e} {t}T: FAILED: {r['error']}")
                    continue
            r["rounds"].append(out)
            r["busy"].append(busy)
            if not is_kiln(e) and "max_abs_diff" not in r:
                y = np.load(preps[m]["dir"] / f"out-{e}-{t}.npy")
                r["max_abs_diff"] = float(np.max(np.abs(y - np.load(preps[m]["dir"] / "eager.npy"))))
            ran = f", cpu target {r['cpu_target']}" if is_kiln(e) and e != "kiln-portable" else ""
            log(f"{m} {label(e)} {t}T: median {out['median_ms']:.3f} ms ({runs} runs{ran}, box busy {busy:.0%} before)")
    for r in res.values():
        if r["rounds"]:
            best = min(r["rounds"], key=lambda o: o["median_ms"])
            r["median_ms"] = best["median_ms"]
            r["min_ms"] = min(o["min_ms"] for o in r["rounds"])
            r["p90_ms"] = best["p90_ms"]
            r["peak_rss_mib"] = max(o["peak_rss_mib"] for o in r["rounds"])
            r["base_rss_mib"] = min(o.get("base_rss_mib", 0.0) for o in r["rounds"])
            r["load_ms"] = min(o["load_ms"] for o in r["rounds"])
            r["init_ms"] = min((o["init_ms"] for o in r["rounds"] if "init_ms" in o), default=None)
            r["threads_reported"] = best.get("threads")
            r["runs"] = [o["runs"] for o in r["rounds"]]
    return res


# ---- the report ----

def fmt(v, digits=2) -> str:
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}f}"


def cpu_model(info: dict) -> str:
    """The CPU model of machine_info() (or of an older results.json: lscpu's "Model name")."""
    return info.get("model") or info.get("Model name") or "?"


def target_options(args) -> str:
    """" --kiln-target avx2 ..." for the command line the report names ("" without forced targets)."""
    return "".join(f" --kiln-target {t}" for t in args.kiln_target)


def forced_note(args) -> str:
    return f"; *Kiln cpu [T]*: KILN_CPU_TARGET=T for T in {', '.join(args.kiln_target)}" if args.kiln_target else ""


def cpu_ratio(res: dict, m: str, engine: str, other: str, t: int) -> str:
    """engine's median / other's, as a table cell ("–" without both figures)."""
    a = res.get(f"{m}|{engine}|{t}", {}).get("median_ms")
    b = res.get(f"{m}|{other}|{t}", {}).get("median_ms")
    return f"{a / b:.2f}" if a and b else "–"


def write_markdown(args, res: dict, preps: dict, info: dict, versions: dict, started: float, path: Path,
                   finished: str | None = None) -> None:
    """Writes the report: the torchvision part (when this run has torchvision models; otherwise the
    existing file's text outside the PP-OCR section is kept as it is) and the PP-OCR section
    (between SECTION_BEGIN and SECTION_END; kept from the existing file when this run has no
    PP-OCR model)."""
    import copy
    tv = [m for m in args.models if m not in PPOCR]
    pp = [m for m in args.models if m in PPOCR]
    old = path.read_text() if path.is_file() else ""
    old_main, old_section = old, ""
    if SECTION_BEGIN in old and SECTION_END in old:
        b, e = old.index(SECTION_BEGIN), old.index(SECTION_END) + len(SECTION_END)
        old_main, old_section = (old[:b] + old[e:]).rstrip() + "\n", old[b:e]
    if tv:
        a = copy.copy(args)
        a.models = tv
        main_text = "\n".join(main_markdown(a, res, preps, info, versions, started, finished)) + "\n"
    else:
        main_text = old_main
    section = "\n".join(ppocr_markdown(args, pp, res, preps, info, versions, finished)) if pp else old_section
    path.write_text(main_text.rstrip() + "\n" + ("\n" + section.strip() + "\n" if section else ""))


def ppocr_markdown(args, models: list, res: dict, preps: dict, info: dict, versions: dict,
                   finished: str | None) -> list:
    """The PP-OCR section: Kiln (portable / cpu / xnnpack) vs ONNX Runtime on the shipped models."""
    L = [SECTION_BEGIN, "## PP-OCR (real pretrained ONNX models): Kiln vs ONNX Runtime\n"]
    cmd = "bash bench/run.sh" + ("" if len(models) != len(args.models) else f" --models {','.join(models)}")
    cmd += target_options(args)
    L.append(f"Measured by `{cmd}` on {finished} UTC (Kiln {versions.get('Kiln')}; "
             f"onnxruntime {versions.get('onnxruntime')}; CPU {cpu_model(info)}, "
             f"{info.get('CPU(s)', info.get('cores'))} vCPU, SIMD: {info.get('simd', '?')}; Kiln cpu kernels: "
             f"{machine.target_summary(info)}{forced_note(args)}). The models are the files shipped in the PyPI package "
             "rapidocr-onnxruntime 1.4.4 (`requirements-models.txt`): PP-OCRv4 detection (ppocr_det) and recognition "
             "(ppocr_rec), PP-OCR mobile v2.0 direction classifier (ppocr_cls). ONNX Runtime runs each file as shipped "
             "(dynamic shapes; `ORT_ENABLE_ALL`, `intra_op_num_threads=N`, `inter_op_num_threads=1`, sequential); "
             "Kiln imports it with its ONNX frontend at the static input shape below (`examples/ocr/export.py`, "
             "`compile_onnx`), without delegates (*portable* = reference kernels only, *cpu* = optimized cpu kernels "
             "where they accept a call) and with `backends=(\"xnnpack\",)` (*xnnpack*; nodes XNNPACK declines run on "
             "the cpu kernels). Input: numpy `default_rng(0)` uniform in [-1, 1] (the range of PP-OCR's normalised "
             "pixels). Timing as above: warm-up, R timed runs "
             f"({', '.join(f'{m} {args.runs.get(m, PPOCR[m][2])}' for m in models)}), {args.rounds} interleaved "
             "round(s), lowest round median; each measurement in its own process. Kiln-best = the fastest Kiln "
             "configuration; ratios < 1.0 mean Kiln is faster (the issue's target: <= 1.0).\n")
    busy = [b for m in models for e in engine_list(args.kiln_target) for t in args.threads
            for b in res.get(f"{m}|{e}|{t}", {}).get("busy", [])]
    if busy:
        L.append(f"Shared box: before each of these measurements the other processes kept the CPU busy "
                 f"{min(busy):.0%}–{max(busy):.0%} (median {sorted(busy)[len(busy) // 2]:.0%}); the script waited up to "
                 f"{args.idle_wait_s:.0f} s for < {args.idle_threshold:.0%}. On a busy box the figures are slow and noisy "
                 "(compare 1 vs 2 threads of one engine), so the ratios are indicative only.\n")
    cols = engine_list(args.kiln_target)[:-2]  # Kiln's configurations and ORT (no ExecuTorch / eager here)
    hdr = ["model", "input", "threads"] + [label(e) for e in cols] + ["Kiln-best", "Kiln-best / ORT"] + \
        [f"{label(e)} / ORT" for e in cpu_engines(args)] + ["max abs diff vs ORT (/ max abs ORT)"]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|" + "---|" * len(hdr))
    errors: dict = {}
    for m in models:
        for t in args.threads:
            row = [m, "x".join(map(str, PPOCR[m][1])), str(t)]
            kb = None
            diffs = []
            for e in cols:
                r = res.get(f"{m}|{e}|{t}", {})
                if r.get("median_ms") is not None:
                    row.append(fmt(r["median_ms"]))
                    if is_kiln(e):
                        if e in KILN_ENGINES and (kb is None or r["median_ms"] < kb[0]):
                            kb = (r["median_ms"], LABEL[e].split()[1])
                        if r.get("max_abs_diff") is not None:
                            diffs.append(r["max_abs_diff"])
                else:
                    n = errors.setdefault(r.get("error") or "not measured", len(errors) + 1)
                    row.append(f"error [{n}]")
            o = res.get(f"{m}|ort|{t}", {}).get("median_ms")
            row.append(f"{fmt(kb[0])} ({kb[1]})" if kb else "–")
            row.append(f"**{kb[0] / o:.2f}**" if kb and o else "–")
            row += [cpu_ratio(res, m, e, "ort", t) for e in cpu_engines(args)]
            scale = preps[m].get("ref_max") or 1.0
            row.append(f"{max(diffs):.1e} ({max(diffs) / scale:.1e})" if diffs else "–")
            L.append("| " + " | ".join(row) + " |")
    L.append("")
    if errors:
        L.append("Errors (the exact message):\n")
        for msg, n in errors.items():
            L.append(f"{n}. `{msg}`")
        L.append("")
    for m in models:
        parts = []
        for e in ("kiln-cpu", "kiln-xnnpack"):
            n = preps[m]["notes"].get(e)
            if n:
                seg = ", ".join(f"{k} {b} segment{'s' if k != 1 else ''}"
                                for b, k in n["delegate_segments"].items()) or "no delegate"
                parts.append(f"{LABEL[e]}: {n['kernel_calls']} kernel calls ({n.get('cpu_kernel_calls')} on optimized "
                             f"cpu kernels), {seg}")
        L.append(f"- **{m}**: " + ("; ".join(parts) or "no program"))
    L.append("")
    for m in models:
        for t in args.threads:
            kb = min((res.get(f"{m}|{e}|{t}", {}).get("median_ms") or float("inf") for e in KILN_ENGINES))
            o = res.get(f"{m}|ort|{t}", {}).get("median_ms")
            L.append(f"- {m}, {t} thread(s), Kiln-best / ONNX Runtime: "
                     + (f"{kb / o:.2f} -> {'met' if kb <= o else 'not met'}" if o and kb < float("inf") else "no figure"))
    L.append(SECTION_END)
    return L


def main_markdown(args, res: dict, preps: dict, info: dict, versions: dict, started: float,
                  finished: str | None = None) -> list:
    """The torchvision part of the report (args.models: torchvision models only), as lines."""
    elapsed = time.time() - started
    L = []
    L.append("# Benchmarks: Kiln vs ONNX Runtime vs ExecuTorch vs PyTorch (CPU, fp32)\n")
    L.append(f"Generated by `bash bench/run.sh{target_options(args)}` on {finished} UTC "
             f"(one run: {elapsed / 60:.1f} min). Regenerate with the same command; figures, not assertions "
             "(CI does not run it). Raw numbers: `build/bench/results.json`.\n")
    L.append("## Machine and versions\n")
    L.append(f"- CPU: {cpu_model(info)}, {info.get('CPU(s)', info.get('cores'))} vCPU "
             f"({info.get('Thread(s) per core', '?')} thread/core), L2 {info.get('L2 cache', '?')}, "
             f"L3 {info.get('L3 cache', '?')}, {info.get('memory_gib')} GiB; SIMD: {info.get('simd', '?')}")
    L.append(f"- Kiln cpu kernels: {machine.target_summary(info)}: the target of *Kiln cpu* and of the cpu kernels "
             f"in *Kiln xnnpack*{forced_note(args)}")
    L.append(f"- OS: {info['platform']}")
    busy = [b for r in res.values() for b in r["busy"]]
    if busy:
        L.append(f"- Shared box: before each measurement the other processes kept the CPU busy "
                 f"{min(busy):.0%}–{max(busy):.0%} (median {sorted(busy)[len(busy) // 2]:.0%}); the script waited up to "
                 f"{args.idle_wait_s:.0f} s for < {args.idle_threshold:.0%}. Figures from a busy box are slower and "
                 "noisier than on an idle one.")
    for k, v in versions.items():
        L.append(f"- {k}: {v}")
    L.append("")
    L.append("## Method\n")
    L.append(f"- Models: torchvision {', '.join(args.models)}; input {'x'.join(map(str, SHAPE))} fp32; seeded random "
             "weights (`torch.manual_seed(0)`; BatchNorm statistics and affine parameters seeded random too, so that "
             "the logits are not ~1e-9), eval mode; the same weights (saved state_dict) and the same input for "
             "every engine.")
    L.append("- Kiln: `kiln bench --json` (the C++ runtime, timed inside the process): *portable* = reference "
             "kernels only; *cpu* = optimized cpu kernels wherever one accepts the call; *xnnpack* = program compiled "
             "with `backends=(\"xnnpack\",)`. The method's thread pool has N threads; delegates get N threads.")
    L.append("- ONNX Runtime: `torch.onnx.export` (TorchScript exporter, opset 17), `ORT_ENABLE_ALL`, "
             "`intra_op_num_threads=N`, `inter_op_num_threads=1`, sequential execution, CPU EP.")
    L.append("- ExecuTorch: `torch.export` -> `to_edge_transform_and_lower(partitioner=[XnnpackPartitioner()])` -> "
             "`.pte`, run with `executorch.runtime` (prebuilt pybindings). Threads: "
             "`portable_lib._unsafe_reset_threadpool(N)` resizes the threadpool the XNNPACK delegate runs on "
             "(checked with `_threadpool_get_thread_count()`).")
    L.append("- PyTorch eager: `torch.set_num_threads(N)`, `torch.inference_mode()`.")
    L.append(f"- Each measurement runs in its own process (OMP_NUM_THREADS=N): warm-up ({args.warmup} runs), then R "
             f"timed runs (R = {', '.join(f'{m} {args.runs.get(m, 50)}' for m in args.models)}; Kiln portable / cpu "
             f"when R runs would take over {args.portable_budget_s:.0f} s (reference kernels): as many as fit, at least 3). {args.rounds} interleaved rounds (every "
             "configuration once per round); the figure is the lowest round median. Python engines time their run "
             "call with `time.perf_counter` (binding overhead of a few µs included).")
    if args.kiln_target:
        L.append(f"- Kiln cpu [T] (`--kiln-target T`): *Kiln cpu* again, in the same rounds, with `KILN_CPU_TARGET=T`: "
                 "the same program's cpu kernels at instruction set T (each such `kiln bench` reports the target it "
                 "ran at, checked to be T). It shows what a machine with only T gets from Kiln's cpu kernels; "
                 "XNNPACK, ONNX Runtime and ExecuTorch keep their own dispatch, so Kiln-best does not use these "
                 "columns.")
    L.append("- Kiln-best = the fastest of the three Kiln configurations (at the target Kiln chose). Kiln cpu / ORT = "
             "the cpu kernels alone against ONNX Runtime. Ratios < 1.0 mean Kiln is faster.\n")

    L.append("## Median latency (ms)\n")
    hdr = ["model", "threads"] + [label(e) for e in engine_list(args.kiln_target)] + \
        ["Kiln-best", "Kiln-best / ORT", "Kiln-best / ExecuTorch"] + [f"{label(e)} / ORT" for e in cpu_engines(args)]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|" + "---|" * len(hdr))
    errors = {}
    for m in args.models:
        for t in args.threads:
            row = [m, str(t)]
            kb = None
            for e in engine_list(args.kiln_target):
                r = res[f"{m}|{e}|{t}"]
                if r.get("median_ms") is not None:
                    row.append(fmt(r["median_ms"]))
                    if e in KILN_ENGINES and (kb is None or r["median_ms"] < kb[0]):
                        kb = (r["median_ms"], LABEL[e].split()[1])
                else:
                    key = r["error"] or "not measured"
                    n = errors.setdefault(key, len(errors) + 1)
                    row.append(f"error [{n}]")
            row.append(f"{fmt(kb[0])} ({kb[1]})" if kb else "–")
            for other in ("ort", "executorch"):
                o = res[f"{m}|{other}|{t}"].get("median_ms")
                row.append(f"**{kb[0] / o:.2f}**" if kb and o else "–")
            row += [cpu_ratio(res, m, e, "ort", t) for e in cpu_engines(args)]
            L.append("| " + " | ".join(row) + " |")
    L.append("")
    if errors:
        L.append("Errors (the exact message):\n")
        for msg, n in errors.items():
            L.append(f"{n}. `{msg}`")
        L.append("")

    L.append("## Spread, load time, memory\n")
    L.append("min / p90 of the best round, ms; load = program load (Kiln: `Program::load`, ORT: session creation, "
             "ExecuTorch: load_program + load_method, torch: model construction + weights); Kiln init = "
             "`load_method` (arena, delegate init: XNNPACK packs weights here). Peak RSS = VmHWM of the measuring "
             "process (peak resident set), MiB; for the Python engines it includes the interpreter and the engine's "
             "libraries (torch alone is several hundred MiB), so the second figure (peak - RSS after imports) is the "
             "fairer comparison.\n")
    hdr = ["model", "engine", "threads (engine says)", "min", "median", "p90", "load ms", "Kiln init ms", "peak RSS MiB",
           "peak - after-imports MiB", "max abs diff vs eager (/ max abs eager)"]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|" + "---|" * len(hdr))
    for m in args.models:
        for e in engine_list(args.kiln_target):
            for t in args.threads:
                r = res[f"{m}|{e}|{t}"]
                if r.get("median_ms") is None:
                    continue
                added = r["peak_rss_mib"] - r["base_rss_mib"] if not is_kiln(e) else None
                diff = r.get("max_abs_diff")
                scale = preps[m].get("ref_max")
                said = r.get("threads_reported")
                name = label(e)
                if e in ("kiln-cpu", "kiln-xnnpack") and r.get("cpu_target"):
                    name += f" (ran at {r['cpu_target']})"
                L.append("| " + " | ".join([m, name, f"{t} ({'?' if said is None else said})", fmt(r["min_ms"]), fmt(r["median_ms"]), fmt(r["p90_ms"]),
                                            fmt(r["load_ms"], 1), fmt(r.get("init_ms"), 1), fmt(r["peak_rss_mib"], 0),
                                            fmt(added, 0),
                                            "–" if diff is None else f"{diff:.1e} ({diff / scale:.1e})"]) + " |")
    L.append("")

    L.append("## Compiled programs\n")
    for m in args.models:
        p = preps[m]
        parts = []
        for e in ("kiln-cpu", "kiln-xnnpack"):
            n = p["notes"].get(e)
            if n:
                seg = ", ".join(f"{k} {b} segment{'s' if k != 1 else ''}"
                                for b, k in n["delegate_segments"].items()) or "no delegate"
                parts.append(f"{LABEL[e]}: {n['kernel_calls']} kernel calls ({n.get('cpu_kernel_calls')} on optimized "
                             f"cpu kernels), {seg}; built with {n['how']}")
        et = p["notes"].get("executorch")
        if et:
            rest = ", ".join(f"{k} x{v}" for k, v in sorted(et["non_delegated_ops"].items())) or "none"
            parts.append(f"ExecuTorch: {et['delegate_calls']} XNNPACK delegate call(s); ops outside the delegate: {rest}")
        L.append(f"- **{m}** (max |eager logit| {p['ref_max']:.2g}): " + "; ".join(parts))
    L.append("")
    L.append("## Reading the table\n")
    L.append("The issue's targets (Kiln-best / ORT and Kiln-best / ExecuTorch <= 1.0 for mobilenet_v3_large at 1 and 2 "
             "threads, and for resnet18):\n")
    for m in ("mobilenet_v3_large", "resnet18"):
        if m not in args.models:
            continue
        for t in args.threads:
            kb = min((res[f"{m}|{e}|{t}"].get("median_ms") or float("inf") for e in KILN_ENGINES))
            for other in ("ort", "executorch"):
                o = res[f"{m}|{other}|{t}"].get("median_ms")
                if o and kb < float("inf"):
                    L.append(f"- {m}, {t} thread(s), vs {LABEL[other]}: {kb / o:.2f} -> "
                             f"{'met' if kb <= o else 'not met'}")
                else:
                    L.append(f"- {m}, {t} thread(s), vs {LABEL[other]}: no figure")
    if len(args.threads) > 1:
        lo, hi = min(args.threads), max(args.threads)
        slower = [f"{label(e)} on {m} ({fmt(res[f'{m}|{e}|{lo}']['median_ms'])} -> {fmt(res[f'{m}|{e}|{hi}']['median_ms'])} ms)"
                  for m in args.models for e in engine_list(args.kiln_target)
                  if res[f"{m}|{e}|{lo}"].get("median_ms") and res[f"{m}|{e}|{hi}"].get("median_ms")
                  and res[f"{m}|{e}|{hi}"]["median_ms"] > 1.1 * res[f"{m}|{e}|{lo}"]["median_ms"]]
        if slower:
            L.append(f"\nSlower with {hi} threads than with {lo} (by more than 10%): {'; '.join(slower)}. On a box "
                     "whose cores are taken by other work, thread pools that spin-wait for each other lose their time "
                     "slices; such figures say more about the load than about the engine.")
    L.append("")
    return L


def parse_args(argv=None) -> argparse.Namespace:
    """The command line: --models, --threads and --kiln-target become lists (--kiln-target: names
    checked against CPU_TARGETS, commas and repeats allowed, duplicates dropped; whether this CPU can
    run them is checked in main, which has Kiln's list), --runs a dict per model."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln-cli", default=str(ROOT / "build" / "tools" / "kiln"))
    ap.add_argument("--et-python", help="python of the ExecuTorch venv (bench/setup_executorch.sh)")
    ap.add_argument("--et-error", help="why there is no ExecuTorch venv (shown in the table)")
    ap.add_argument("--models", default=",".join(MODELS + list(PPOCR)),
                    help="comma-separated (default: all): " + ", ".join(MODELS + list(PPOCR)))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, help="timed runs per round for every model (default: 50, resnet18 30)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--portable-budget-s", type=float, default=6.0)
    ap.add_argument("--idle-threshold", type=float, default=0.25)
    ap.add_argument("--idle-wait-s", type=float, default=5.0)
    ap.add_argument("--work", default=str(ROOT / "build" / "bench"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--kiln-target", action="append", default=[], metavar="T",
                    help="also time the Kiln cpu kernels with KILN_CPU_TARGET=T in the same rounds (columns "
                         "'Kiln cpu [T]'), e.g. --kiln-target avx2 on an AVX-512 machine; repeatable or comma-separated; "
                         f"T in {', '.join(CPU_TARGETS)} (those this CPU supports: `build/tools/kiln --version`)")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite --out from <work>/results.json of an earlier run (no measuring)")
    args = ap.parse_args(argv)
    targets = []
    for t in (x.strip() for v in args.kiln_target for x in v.split(",")):
        if t and t not in targets:
            targets.append(t)
    bad = [t for t in targets if t not in CPU_TARGETS]
    if bad:
        ap.error(f"--kiln-target {', '.join(bad)}: not a cpu kernel target (targets: {', '.join(CPU_TARGETS)})")
    args.kiln_target = targets
    args.models = [m for m in args.models.split(",") if m]
    args.threads = [int(t) for t in args.threads.split(",") if t]
    unknown = [m for m in args.models if m not in MODELS and m not in PPOCR]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS + list(PPOCR))}")
    args.runs = {m: args.runs for m in args.models} if args.runs else dict(
        {"mobilenet_v3_small": 50, "mobilenet_v3_large": 50, "resnet18": 30}, **{m: v[2] for m, v in PPOCR.items()})
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    work = Path(args.work)
    if args.report_only:
        saved = json.loads((work / "results.json").read_text())
        args.kiln_target = []  # a run before --kiln-target existed
        for k, v in saved["args"].items():
            if k not in ("out", "work"):
                setattr(args, k, v)
        preps = {m: {"notes": saved["programs"][m], "errors": saved["errors"][m], "ref_max": saved["ref_max"][m]}
                 for m in args.models}
        write_markdown(args, saved["results"], preps, saved["machine"], saved["versions"],
                       time.time() - saved["elapsed_s"], Path(args.out), saved.get("finished"))
        log(f"wrote {args.out} from {work / 'results.json'}")
        return 0
    if not os.path.isfile(args.kiln_cli):
        log(f"{args.kiln_cli} not found: build Kiln first (bash bench/run.sh does)")
        return 1
    sys.path.insert(0, str(ROOT / "python"))
    import onnxruntime
    import torch
    import torchvision
    et_python = args.et_python if args.et_python and os.path.isfile(args.et_python) else None
    versions = {"Kiln": f"{kiln_commit()} (Release build; XNNPACK from Debian libxnnpack0 {pkg_version('libxnnpack0')})",
                "onnxruntime": f"{onnxruntime.__version__} (PyPI, Kiln's venv)",
                "PyTorch eager": f"torch {torch.__version__}, torchvision {torchvision.__version__} (Kiln's venv)"}
    if et_python:
        r = subprocess.run([et_python, "-c", "import executorch.version as v, torch; print(v.__version__, torch.__version__)"],
                           capture_output=True, text=True)
        versions["ExecuTorch"] = (f"executorch {r.stdout.split()[0]} with torch {r.stdout.split()[1]} (PyPI, own venv)"
                                  if r.returncode == 0 else f"unusable: {last_error_line(r.stderr)}")
        if r.returncode != 0:
            args.et_error, et_python = versions["ExecuTorch"], None
    else:
        versions["ExecuTorch"] = f"not available: {args.et_error or 'no --et-python'}"
    info = machine_info()
    log(f"cpu: {machine.cpu_summary(info)}")
    if info.get("kiln_cpu_target") is None:
        log(f"Kiln has no cpu kernel target here: {info.get('kiln_cpu_target_error')}")
        return 1
    unavailable = [t for t in args.kiln_target if t not in info["kiln_cpu_targets_available"]]
    if unavailable:
        log(f"--kiln-target {', '.join(unavailable)}: not available on this machine (Kiln's cpu kernel targets "
            f"here: {', '.join(info['kiln_cpu_targets_available'])})")
        return 2
    work.mkdir(parents=True, exist_ok=True)
    preps = {}
    for m in args.models:
        log(f"preparing {m}")
        preps[m] = prepare(args, m, work, et_python)
    res = run_all(args, preps, et_python)
    finished = f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M}"
    with open(work / "results.json", "w") as f:
        json.dump({"machine": info, "versions": versions, "results": res, "elapsed_s": time.time() - started,
                   "finished": finished, "args": {k: v for k, v in vars(args).items()},
                   "programs": {m: p["notes"] for m, p in preps.items()},
                   "ref_max": {m: p["ref_max"] for m, p in preps.items()},
                   "errors": {m: p["errors"] for m, p in preps.items()}}, f, indent=1, default=str)
    write_markdown(args, res, preps, info, versions, started, Path(args.out), finished)
    log(f"wrote {args.out} and {work / 'results.json'} in {(time.time() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
