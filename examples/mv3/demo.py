#!/usr/bin/env python3
"""The mv3 demo: export ImageNet classifiers to .kiln, classify photos in C++, check against PyTorch.

    scripts/demo.sh [--weights-dir DIR]           # set-up + build + this script
    PYTHONPATH=python python examples/mv3/demo.py [--weights-dir DIR] [--models ...] [--runs N]

Steps:
  1. Weights: with --weights-dir, DIR/<model>.pth (torchvision state dicts) are used. Without it,
     a model whose torchvision pretrained weights (the DEFAULT ImageNet weights) are already in the
     local torch hub cache (torch.hub.get_dir()/checkpoints/, where torchvision stores them after a
     download elsewhere) uses those, and the demo says so: real class names. Nothing is downloaded.
     Any other model is initialised randomly (torch.manual_seed(0); BatchNorm statistics calibrated so
     that logits are of order 1: see random_weights) and its state dict is written to
     OUT/weights/<model>.pth, so the exported program and the eager reference hold the same
     weights. Random weights make the class names meaningless: only the numbers are checked.
  2. Export every model with examples/mv3/export.py into OUT (default out/mv3/): one file per model
     and backend (--backends, default every backend this build has), OUT/<model>_<backend>.kiln
     (see export()): <model>_portable.kiln runs on Kiln's CPU kernels, <model>_xnnpack.kiln (when the
     xnnpack delegate is built) is compiled with require_delegation="xnnpack", i.e. the whole model
     is one XNNPACK segment.
  3. Write the ImageNet class names (shipped inside torchvision) to OUT/imagenet_classes.txt.
  4. For every exported file and each photo (chelsea.png, coffee.png, astronaut.png from
     scikit-image's data folder; nothing is downloaded), run the C++ `classify` binary with
     --save-input/--save-logits, run the same model in PyTorch eager on the saved input, and print
     one table row: model | backend | photo | top-1 class | max |logit - eager| | top-5 same | latency
     (the rows of every backend for one model and photo are printed together).

Exit status: 0 when every row passed; 1 when an export or a classify run failed, a model is missing
a program file, any max |logit - eager| > --tolerance (default 1e-4, absolute), or the top-5 class
order differs from eager.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODELS = ("mobilenet_v3_small", "mobilenet_v3_large", "resnet18")
PHOTOS = ("chelsea.png", "coffee.png", "astronaut.png")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights-dir", help="folder with torchvision state dicts <model>.pth (default: torchvision pretrained weights found in the torch hub cache, else random weights)")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "out", "mv3"), help="where programs and outputs go")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"), help="CMake build folder holding classify")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--classify", help="the classify binary (default: BUILD_DIR/examples/mv3/classify); e.g. one built "
                   "out of tree against an installed Kiln: cmake -S examples/mv3 -DCMAKE_PREFIX_PATH=<prefix>")
    p.add_argument("--runs", type=int, default=10, help="timed classify runs per row (median printed)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max |logit - eager| allowed (absolute)")
    p.add_argument("--backends", nargs="+", help="backends to export for (default: every backend built, "
                   "kiln.capture.BUILT_BACKENDS)")
    p.add_argument("--skip-export", action="store_true", help="reuse the .kiln files already in --out-dir")
    return p.parse_args(argv)


def build_model(name: str, weights_path: str) -> torch.nn.Module:
    """torchvision model `name` with the state dict at `weights_path`, in eval mode."""
    model = getattr(torchvision.models, name)(weights=None)
    state = torch.load(weights_path, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def hub_cached_weights(name: str) -> tuple[str, str] | None:
    """(path, weights enum name) of torchvision's DEFAULT pretrained weights for model `name` when the
    file is already in the torch hub cache (torch.hub.get_dir()/checkpoints/<file name of the
    weights' URL>, honouring TORCH_HOME), else None. Never downloads."""
    try:
        weights = torchvision.models.get_model_weights(name).DEFAULT
    except (ValueError, AttributeError):
        return None
    path = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(weights.url))
    return (path, f"{type(weights).__name__}.{weights.name}") if os.path.isfile(path) else None


def usable_state_dict(name: str, path: str) -> str | None:
    """None when `path` loads (torch.load, weights only) into torchvision's `name` model (strict
    load_state_dict), else one line saying why not (a truncated, corrupt or other model's file)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        getattr(torchvision.models, name)(weights=None).load_state_dict(state)
    except Exception as e:  # noqa: BLE001  (any failure makes the file unusable; say which)
        first = (str(e).strip().splitlines() or [""])[0]
        return f"{type(e).__name__}: {first[:160]}{'...' if len(first) > 160 else ''}"
    return None


def random_weights(names, folder: str, photos) -> None:
    """Writes folder/<name>.pth: random weights whose activations and logits stay of order 1.

    torchvision's own initialisation (under torch.manual_seed(0)) for convolutions and linear
    layers, then:
    - every BatchNorm gets a random affine transform (weight ~ U(0.5, 1.5), bias ~ N(0, 0.1)) and
      running statistics measured on `photos` (paths) and their mirror images, preprocessed as
      classify does (one calibration pass in train mode, cumulative averages);
    - the last Linear layer (the classifier) gets weight ~ N(0, 1 / in_features), bias ~ N(0, 0.1).
    With the plain initialisation (running mean 0, variance 1, classifier std 0.01) MobileNetV3's
    logits are ~1e-9, which would make the 1e-4 logit tolerance and the top-5 check meaningless;
    with these, logits are ~0.1-3 and the top-5 gaps ~1e-3 on the demo photos.
    """
    os.makedirs(folder, exist_ok=True)
    from PIL import Image
    import torchvision.transforms.functional as TF

    images = []
    for path in photos:  # the photos themselves, and mirrored: the statistics the demo will meet
        t = TF.pil_to_tensor(Image.open(path).convert("RGB")).float() / 255.0
        t = TF.center_crop(TF.resize(t, 256, antialias=False), [224, 224])
        t = TF.normalize(t, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
        images += [t, t.flip(-1)]
    calibration = torch.stack(images)
    for name in names:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                with torch.no_grad():
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.normal_(0.0, 0.1)
                m.reset_running_stats()
                m.momentum = None  # cumulative moving average over the calibration pass
        head = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
        with torch.no_grad():
            head.weight.normal_(0.0, head.in_features ** -0.5)
            head.bias.normal_(0.0, 0.1)
        model.train()
        with torch.no_grad():
            model(calibration)
        torch.save(model.state_dict(), os.path.join(folder, f"{name}.pth"))


def class_names() -> list[str]:
    # torchvision ships the 1000 ImageNet class names with every ImageNet weights enum.
    return list(torchvision.models.MobileNet_V3_Small_Weights.IMAGENET1K_V1.meta["categories"])


def photo_paths() -> dict[str, str]:
    import skimage.data

    folder = os.path.dirname(skimage.data.__file__)
    paths = {p: os.path.join(folder, p) for p in PHOTOS}
    for p, path in paths.items():
        if not os.path.isfile(path):
            sys.exit(f"demo: {path} missing: the installed scikit-image has no {p} (no download is attempted)")
    return paths


def export(models, out_dir: str, weights_dir: str, backends) -> list[str]:
    """Runs examples/mv3/export.py once per model; returns a failure line per model that failed.

    Each model is exported into its own staging folder OUT/.export/<model>/ and every file it writes
    there, <anything>_<backend>.kiln, is moved to OUT/<model>_<backend>.kiln: the demo's file names
    do not depend on export.py's. Weights are passed as --weights-dir DIR when export.py offers that
    option, otherwise as --weights <model>=DIR/<model>.pth; `backends` as --backends when offered.
    """
    script = os.path.join(HERE, "export.py")
    usage = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True).stdout
    failures = []
    for name in models:
        for f in glob.glob(os.path.join(out_dir, f"{name}_*.kiln")):  # never report a stale file
            os.remove(f)
        stage = os.path.join(out_dir, ".export", name)
        shutil.rmtree(stage, ignore_errors=True)
        os.makedirs(stage)
        if "--weights-dir" in usage:
            weights = ["--weights-dir", weights_dir]
        else:
            weights = ["--weights", f"{name}={os.path.join(weights_dir, name + '.pth')}"]
        cmd = [sys.executable, script, "--models", name, "--out-dir", stage, *weights]
        if "--backends" in usage:
            cmd += ["--backends", *backends]
        print("$ " + " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        written = sorted(glob.glob(os.path.join(stage, "*.kiln")))
        for f in written:
            stem = os.path.basename(f)[:-len(".kiln")]
            backend = stem.rsplit("_", 1)[1] if "_" in stem else "default"
            shutil.move(f, os.path.join(out_dir, f"{name}_{backend}.kiln"))
        shutil.rmtree(stage, ignore_errors=True)
        print(f"export {name}: exit status {rc}, {len(written)} program(s), {time.perf_counter() - t0:.1f} s", flush=True)
        if rc != 0:
            failures.append(f"{name}: export.py exited with status {rc}")
    shutil.rmtree(os.path.join(out_dir, ".export"), ignore_errors=True)
    return failures


def programs_of(model: str, out_dir: str) -> list[tuple[str, str]]:
    """(backend, path) of every OUT/<model>_<backend>.kiln, portable first."""
    found = []
    for path in glob.glob(os.path.join(out_dir, f"{model}_*.kiln")):
        backend = os.path.basename(path)[len(model) + 1:-len(".kiln")]
        if not backend or "_" in backend:  # backend names have no '_': anything else is not ours
            continue
        found.append((backend, path))
    return sorted(found, key=lambda bp: (bp[0] != "portable", bp[0]))


def top5(logits: np.ndarray) -> list[int]:
    """Indices of the 5 highest scores, highest first, ties by lower index (as classify orders them)."""
    return [int(i) for i in np.argsort(-logits.reshape(-1), kind="stable")[:5]]


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = os.path.abspath(args.out_dir)
    io_dir = os.path.join(out_dir, "io")
    os.makedirs(io_dir, exist_ok=True)
    classify = args.classify or os.path.join(args.build_dir, "examples", "mv3", "classify")
    if not os.path.isfile(classify):
        sys.exit(f"demo: {classify} not found: build first (scripts/demo.sh does: cmake --build build --target classify)")
    photos = photo_paths()

    real: list[str] = []  # models with pretrained weights (meaningful class names)
    if args.weights_dir is None:
        weights_dir = os.path.join(out_dir, "weights")
        os.makedirs(weights_dir, exist_ok=True)
        for m in args.models:
            hit = hub_cached_weights(m)
            if hit and (why := usable_state_dict(m, hit[0])):
                print(f"demo: {m}: the torch hub cache file {hit[0]} cannot be used ({why}); delete it, or "
                      "download it again. Using random weights instead.")
                hit = None
            dst = os.path.join(weights_dir, f"{m}.pth")
            if os.path.lexists(dst):
                os.remove(dst)
            if hit:
                os.symlink(hit[0], dst)
                real.append(m)
                print(f"demo: {m}: using torchvision's pretrained weights {hit[1]} from the torch hub cache ({hit[0]})")
        rand = [m for m in args.models if m not in real]
        if rand:
            random_weights(rand, weights_dir, photos.values())
            print(f"demo: {', '.join(rand)}: no --weights-dir and no pretrained weights in the torch hub cache "
                  f"({os.path.join(torch.hub.get_dir(), 'checkpoints')}): using RANDOM weights (seed 0, BatchNorm "
                  f"calibrated) in {weights_dir}")
            print("demo: with random weights the predicted class names are MEANINGLESS; only the Kiln-vs-PyTorch "
                  "numbers below are checked")
    else:
        weights_dir = os.path.abspath(args.weights_dir)
        real = list(args.models)
        for m in args.models:
            if not os.path.isfile(os.path.join(weights_dir, f"{m}.pth")):
                sys.exit(f"demo: {weights_dir}/{m}.pth not found (expected a torchvision state dict)")
    random = [m for m in args.models if m not in real]

    failures = []
    if not args.skip_export:
        if args.backends:
            backends = args.backends
        else:
            from kiln import capture

            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from export import default_backends  # examples/mv3/export.py

            backends = default_backends(capture.BUILT_BACKENDS)
        print("demo: exporting for backends: " + ", ".join(backends))
        failures += export(args.models, out_dir, weights_dir, backends)

    labels_path = os.path.join(out_dir, "imagenet_classes.txt")
    names = class_names()
    with open(labels_path, "w") as f:
        f.write("".join(n + "\n" for n in names))
    print(f"demo: wrote {len(names)} ImageNet class names to {labels_path}")

    rows = []
    mlx_reason_said = False  # the mlx NotFound reason is printed once, not once per photo
    for model_name in args.models:
        programs = programs_of(model_name, out_dir)
        if not programs:
            failures.append(f"{model_name}: no program file {out_dir}/{model_name}_<backend>.kiln")
            rows.append((model_name, "-", "-", "NO PROGRAM", "-", "-", "-"))
            continue
        model = build_model(model_name, os.path.join(weights_dir, f"{model_name}.pth"))
        for photo, photo_path in photos.items():  # one row per backend for each photo, side by side
            for backend, program in programs:
                stem = f"{model_name}_{backend}_{os.path.splitext(photo)[0]}"
                x_path, y_path = os.path.join(io_dir, stem + ".x.npy"), os.path.join(io_dir, stem + ".y.npy")
                for p in (x_path, y_path):
                    if os.path.exists(p):
                        os.remove(p)
                cmd = [classify, program, photo_path, "--labels", labels_path, "--top", "5", "--runs", str(args.runs),
                       "--save-input", x_path, "--save-logits", y_path]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0 and backend == "mlx" and "NotFound" in r.stderr and "KILN_MLX_DEVICE" not in os.environ:
                    # No MLX GPU here (docs/mlx.md): say why (once), then run the same file on MLX's CPU device.
                    if not mlx_reason_said:
                        print(f"demo: {stem}: {r.stderr.strip().splitlines()[-1]}\n"
                              "demo: every mlx program runs again with KILN_MLX_DEVICE=cpu (MLX's CPU device)")
                        mlx_reason_said = True
                    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "KILN_MLX_DEVICE": "cpu"})
                if r.returncode != 0:
                    failures.append(f"{stem}: classify exited {r.returncode}: {r.stderr.strip()}")
                    rows.append((model_name, backend, photo, "CLASSIFY FAILED", "-", "-", "-"))
                    continue
                m = re.search(r"^latency: ([0-9.]+) ms", r.stdout, re.M)
                latency = float(m.group(1)) if m else float("nan")
                x = np.load(x_path)
                kiln_logits = np.load(y_path).reshape(-1)
                with torch.no_grad():
                    eager = model(torch.from_numpy(x)).numpy().reshape(-1)
                if kiln_logits.shape != eager.shape:
                    failures.append(f"{stem}: Kiln gives {kiln_logits.shape[0]} scores, eager {eager.shape[0]}")
                    rows.append((model_name, backend, photo, "SHAPE MISMATCH", "-", "-", f"{latency:.2f}"))
                    continue
                err = float(np.max(np.abs(kiln_logits.astype(np.float64) - eager.astype(np.float64))))
                same_top5 = top5(kiln_logits) == top5(eager)
                top1 = top5(kiln_logits)[0]
                if not err <= args.tolerance:  # also catches NaN
                    failures.append(f"{stem}: max |logit - eager| = {err:.3e} > {args.tolerance:g}")
                if not same_top5:
                    failures.append(f"{stem}: top-5 {top5(kiln_logits)} != eager {top5(eager)}")
                rows.append((model_name, backend, photo, f"{names[top1]} ({top1})", f"{err:.2e}",
                             "yes" if same_top5 else "NO", f"{latency:.2f}"))

    header = ("model", "backend", "photo", "top-1 class", "max |logit - eager|", "top-5 same", "latency ms")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: " | ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    print()
    print(line(header))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    print()
    print(f"latency: median of {args.runs} runs of classify's forward after 1 warm-up; "
          f"tolerance: max |logit - eager| <= {args.tolerance:g}")
    if random:
        print(f"NOTE: RANDOM weights for {', '.join(random)} (no --weights-dir, nothing in the torch hub cache): "
              "their class names above are meaningless; pass --weights-dir with torchvision state dicts "
              "<model>.pth, or have torchvision's pretrained weights in the torch hub cache, for real predictions.")
    if real and not failures:
        print(f"pretrained weights: {', '.join(real)}: the class names above are real predictions.")
    if failures:
        print(f"\nFAILED ({len(failures)}):")
        for f in failures:
            print("  - " + f)
        return 1
    print(f"\nOK: {len(rows)} rows, every program matches PyTorch eager")
    return 0


if __name__ == "__main__":
    sys.exit(main())
