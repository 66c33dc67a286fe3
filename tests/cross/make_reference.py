"""Reference programs for the cross-architecture test (scripts/cross-test.sh, docs/cross-test.md).

Runs on the x86-64 host with the project's virtualenv (PYTHONPATH=python, the x86 kiln module
built): compiles a few whole programs for Kiln's cpu backend with seeded weights and inputs, runs
them in PyTorch eager here, and writes into OUT_DIR (build-aarch64/reference by default; generated,
never committed):
  <name>.kiln          the program (method "forward")
  <name>.in<i>.npy     its inputs (float32)
  <name>.out<i>.npy    PyTorch eager's outputs (float32)
  manifest.txt         "<name> <num_inputs> <num_outputs> <atol> <rtol>" per program
tests/cpp/reference_programs_test.cpp (KILN_REFERENCE_DIR=OUT_DIR) runs the programs on the other
machine (aarch64 under qemu, NEON target) and checks |got - ref| <= atol + rtol * |ref| per element.

Programs (each exercises a set of cpu-kernel families):
  mobilenet_v3_small  torchvision, weights=None (seeded init, batch norms calibrated): conv 3x3/1x1 (GEMM + packing),
                      depthwise, hardswish/hardsigmoid/relu (fused epilogues), squeeze-excite
                      (global pooling, broadcast mul), linear
  transformer_block   torch.nn.TransformerEncoderLayer (d_model 128, 4 heads, GELU, pre-norm) with a
                      causal mask: layer norm, linear/GEMM, attention (softmax/exp), GELU (erf)
  quant_linear_w8     Linear-SiLU-Linear quantized at export: int8, one scale per output channel
  quant_linear_w4     the same, int4 in groups of 32, asymmetric (zeros), float16 scales, one row
                      (the matrix-vector path)
The quantized references are PyTorch eager on the weights that the file's packed bytes encode
(dequantized here as src/ir/ops/quant.h defines them), so that they test the kernels, not the
quantization error; that error is printed too, to show it is well above the tolerance.

Tolerances (why): the kernels sum in another order than PyTorch's (blocked GEMM, Winograd/im2col
convolutions, SIMD lane-wise partial sums whose count depends on the vector length: 4 lanes on
NEON, 16 on AVX-512), compute exp/erf/tanh with their own polynomials (src/kernels/cpu/vec-inl.h:
1-2 ulp) and use FMA or not; each rounding differs by ~1e-7 relative, and the differences grow with
the reduction length and the depth. So the bound is relative to the output's scale:
atol = ATOL_REL * max|ref|, plus RTOL per element. The largest error measured, as a fraction of
max|ref|, is 1.4e-6 (mobilenet_v3_small; x86 AVX-512 and portable kernels, and aarch64 under qemu:
docs/cross-test.md); ATOL_REL = RTOL = 1e-4 leave a factor ~70 for the NEON kernels' other
blocking and polynomials, and are still ~1000x below what a kernel bug gives (a wrong lane, a
dropped tail or a swapped operand give errors of the order of the outputs). The script checks the
x86 build against the same bound before writing, so a reference that the host itself cannot meet
is never shipped to the cross test.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn as nn

import kiln
from kiln import _kiln

ATOL_REL = 1e-4
RTOL = 1e-4


def dequantize(w: np.ndarray, scheme: str, group_size: int, symmetric: bool, scale_dtype: str) -> np.ndarray:
    """The float32 weight [rows, k] that Kiln's packed bytes encode for `w` (quantize_matrix, the
    function the compiler's quantization pass calls; decoding as src/ir/ops/quant.h and
    tests/python/test_quant.py's dequantize)."""
    packed, scales, zeros = _kiln.quantize_matrix(np.ascontiguousarray(w, np.float32), scheme, group_size,
                                                  symmetric, scale_dtype)
    rows, k = w.shape
    gs = k if scheme == "w8" else min(group_size, k)
    g = -(-k // gs)
    s = np.repeat(scales.view(np.dtype(scale_dtype)).astype(np.float32).reshape(rows, g), gs, axis=1)[:, :k]
    if scheme == "w8":
        return packed.view(np.int8).reshape(rows, k).astype(np.float32) * s
    b = packed.view(np.uint8).reshape(rows, (k + 1) // 2)
    u = np.stack([b & 0xF, b >> 4], axis=-1).reshape(rows, -1)[:, :k].astype(np.int32)
    out = (u - 8).astype(np.float32) * s
    if zeros.size:
        z = zeros.view(np.dtype(scale_dtype)).astype(np.float32).reshape(rows, g)
        out = out + np.repeat(z, gs, axis=1)[:, :k]
    return out


class Block(nn.Module):
    """A pre-norm transformer encoder layer with a causal mask (as in tests/python/tiny_models.py)."""

    def __init__(self, d: int = 128, heads: int = 4, ff: int = 256, seq: int = 32):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu", batch_first=True,
                                                norm_first=True)
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))

    def forward(self, x):
        return self.layer(x, src_mask=self.mask)


class Mlp(nn.Module):
    def __init__(self, k: int = 256, hidden: int = 512, n: int = 64):
        super().__init__()
        self.fc1 = nn.Linear(k, hidden)
        self.act = nn.SiLU()
        self.fc2 = nn.Linear(hidden, n)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def calibrate_batch_norm(model: nn.Module, shape) -> nn.Module:
    """Sets the batch norms' running statistics from two seeded random batches (cumulative average)
    and returns the model in eval mode. With weights=None the statistics are 0/1 and the activations
    shrink layer after layer (mobilenet_v3_small's logits come out ~1e-9: a comparison would test
    nothing); calibrated, every layer's output has roughly unit scale, as with trained weights."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(*shape))
    return model.eval()


def programs():
    """(name, module, inputs, export kwargs, reference module) per program; seeded."""
    import torchvision
    torch.manual_seed(0)
    mv3 = calibrate_batch_norm(torchvision.models.mobilenet_v3_small(weights=None), (4, 3, 224, 224))
    yield "mobilenet_v3_small", mv3, (torch.randn(1, 3, 224, 224),), {}, mv3

    torch.manual_seed(1)
    block = Block().eval()
    yield "transformer_block", block, (torch.randn(2, 32, 128),), {}, block

    for name, rows, opts in (("quant_linear_w8", 8, dict(quantize="w8")),
                             ("quant_linear_w4", 1, dict(quantize="w4", group_size=32, symmetric=False,
                                                         scale_dtype="float16"))):
        torch.manual_seed(2)
        m = Mlp().eval()
        ref = Mlp().eval()
        ref.load_state_dict(m.state_dict())
        with torch.no_grad():
            for lin in (ref.fc1, ref.fc2):
                lin.weight.copy_(torch.from_numpy(dequantize(
                    lin.weight.numpy(), opts["quantize"], opts.get("group_size", 128), opts.get("symmetric", True),
                    opts.get("scale_dtype", "float32"))))
        yield name, m, (torch.randn(rows, 256),), opts, ref


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", nargs="?", default="build-aarch64/reference")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.set_num_threads(1)
    manifest = ["# name num_inputs num_outputs atol rtol  (tests/cross/make_reference.py)"]
    for name, module, inputs, opts, ref_module in programs():
        with torch.no_grad():
            ref = ref_module(*inputs)
        refs = [ref] if isinstance(ref, torch.Tensor) else list(ref)
        refs = [r.detach().numpy().astype(np.float32) for r in refs]
        path = os.path.join(args.out_dir, name + ".kiln")
        kiln.export(module, inputs, out=path, verbose=False, **opts)
        ins = [np.ascontiguousarray(t.numpy(), np.float32) for t in inputs]
        for i, a in enumerate(ins):
            np.save(os.path.join(args.out_dir, f"{name}.in{i}.npy"), a)
        scale = max(float(np.abs(r).max()) for r in refs)
        atol = ATOL_REL * scale
        # The host must meet the bound itself (default target, and the portable kernels).
        for portable in (False, True):
            got = kiln.load(path, portable_kernels_only=portable).run(*ins)
            for o, (g, r) in enumerate(zip(got, refs)):
                err = np.abs(g - r)
                ok = bool(np.all(err <= atol + RTOL * np.abs(r)))
                print(f"{name} output {o} on x86 ({'portable' if portable else 'optimized cpu'} kernels): "
                      f"max abs error {err.max():.3g}, max |ref| {np.abs(r).max():.4g}, atol {atol:.3g}, rtol {RTOL}"
                      f": {'ok' if ok else 'FAILED'}")
                if not ok:
                    return 1
        if "quantize" in opts:
            with torch.no_grad():
                fp = module(*inputs).numpy()
            print(f"{name}: quantization error (float32 model vs quantized reference) {np.abs(fp - refs[0]).max():.3g}"
                  f" = {np.abs(fp - refs[0]).max() / atol:.0f}x atol")
        for o, r in enumerate(refs):
            np.save(os.path.join(args.out_dir, f"{name}.out{o}.npy"), r)
        manifest.append(f"{name} {len(ins)} {len(refs)} {atol:.6g} {RTOL:g}")
    with open(os.path.join(args.out_dir, "manifest.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    print(f"reference programs written to {args.out_dir}: {len(manifest) - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
