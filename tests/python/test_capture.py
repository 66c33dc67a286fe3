"""kiln.export / kiln.export_program: PyTorch modules captured, compiled, loaded and run by the C++
runtime, compared with PyTorch eager (fp32: max abs error <= 1e-5 * max|expected|).

Tests that need ops which have not been built into this Kiln yet are skipped with the list of
missing ops (docs/op-set.md lists the set); everything else runs.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.capture import ExportError, decomposition_table
from oprunner import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def requires(*ops):
    missing = sorted(set(ops) - set(kiln.op_names()))
    return pytest.mark.skipif(bool(missing), reason=f"Kiln ops not built yet: {', '.join(missing)}")


def export_and_run(module, inputs, *, rel=1e-5, method="forward", **kw):
    """Exports module(*inputs), runs it with the C++ runtime, compares every output with eager."""
    inputs = tuple(inputs)
    module = module.eval()
    with torch.no_grad():
        expected = getattr(module, method)(*[x.clone() for x in inputs])
    res = kiln.export(module, inputs, method=method, verbose=False, **kw)
    prog = kiln.load_bytes(res.data)
    got = prog.run(*inputs, method=method)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_close(g, e.detach().contiguous().numpy(), rel=rel, what=f"output {i}")
    return res


# --------------------------------------------------------------------------------------------------
# basics, in-place ops, constants (need only aten.add / aten.relu)

class AddRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(3, 4))
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x, y):
        return torch.relu(x + y) + self.b + self.w + 2.5, torch.add(x, y, alpha=-0.5)


def test_params_buffers_scalars_alpha():
    torch.manual_seed(0)
    res = export_and_run(AddRelu(), (torch.randn(3, 4), torch.randn(4)))
    m = res.report["methods"][0]
    assert m["name"] == "forward" and m["num_nodes"] >= 4
    # constants b (48 B) + w (16 B) + 2.5 (4 B)
    assert res.report["constant_bytes"] == 48 + 16 + 4


class InPlace(nn.Module):
    def forward(self, x):
        y = x.clone()
        y.add_(1.5)
        y.relu_()
        y += x
        z = torch.relu_(y + 0)
        return z


def test_in_place_ops():
    export_and_run(InPlace(), (torch.randn(2, 3, 5),))


class MutatesInput(nn.Module):
    def forward(self, x):
        x.add_(1.0)
        return torch.relu(x)


def test_in_place_on_input_is_noted():
    x = torch.randn(4, 4)
    res = kiln.export(MutatesInput(), (x.clone(),), verbose=False)
    (got,) = kiln.load_bytes(res.data).run(x)
    assert_close(got, torch.relu(x + 1).numpy())
    assert any("mutates input" in n for n in res.notes)


class ForwardConstants(nn.Module):
    def forward(self, x):
        c = torch.tensor([1.0, -2.0, 3.0, 0.5])           # lifted constant
        a = torch.arange(4, dtype=torch.float32)           # factory ops, evaluated at export
        o = torch.ones(4) + 1
        f = torch.full((3, 4), 0.25)
        z = torch.zeros_like(x)                            # depends only on x's shape
        return x + c + a + o + f + z, torch.ones(2, 2)     # second output: a pure constant


def test_constants_created_in_forward():
    export_and_run(ForwardConstants(), (torch.randn(3, 4),))


class PermutedParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3).t())       # non-contiguous parameter
        self.register_buffer("b", torch.randn(3, 6)[:, 1:5])  # strided buffer
        self.v = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        folded = self.v.t().contiguous().view(12).view(4, 3).t()   # evaluated at export, views included
        return x + self.w + self.b + folded


def test_non_contiguous_constants():
    m = PermutedParam()
    assert not m.w.is_contiguous() and not m.b.is_contiguous()
    export_and_run(m, (torch.randn(2, 3, 4),))


def test_non_contiguous_example_input():
    x = torch.randn(4, 3).t()   # the program takes a (3, 4) tensor; the example's strides don't matter
    res = kiln.export(AddRelu(), (x, torch.randn(4)), verbose=False)
    prog = kiln.load_bytes(res.data)
    assert prog.method("forward").inputs[0]["sizes"] == [3, 4]


def test_same_tensor_passed_as_two_inputs():
    """One tensor object as both example inputs: torch.export alone gives both one placeholder (the
    program would compute from y alone, whatever x is); kiln.export keeps two inputs, each read."""
    module = AddRelu().eval()
    x = torch.randn(3, 4)
    res = kiln.export(module, (x, x), verbose=False)
    prog = kiln.load_bytes(res.data)
    assert [i["sizes"] for i in prog.method("forward").inputs] == [[3, 4], [3, 4]]
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    got = prog.run(a, b)
    with torch.no_grad():
        want = module(a, b)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w.numpy(), rel=1e-5, what=f"output {i}")


def test_output_is_input_and_duplicate_outputs():
    class M(nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            return x, y, y

    export_and_run(M(), (torch.randn(5),))


def test_non_forward_method_and_module_paths():
    class Inner(nn.Module):
        def decode(self, x):
            return torch.relu(x) + 1

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def decode(self, x):
            return self.inner.decode(x)

    res = export_and_run(Outer(), (torch.randn(3),), method="decode")
    assert res.methods == ["decode"]


def test_written_file_loads(tmp_path):
    out = tmp_path / "sub" / "m.kiln"
    torch.manual_seed(0)
    m = AddRelu()
    x, y = torch.randn(3, 4), torch.randn(4)
    res = kiln.export(m, (x, y), out=out, verbose=False)
    assert res.path == str(out) and out.stat().st_size == res.file_size
    got = kiln.load(out).run(x, y)
    assert_close(got[0], m(x, y)[0].detach().numpy())


def test_progress_and_report_printed(capsys):
    kiln.export(AddRelu(), (torch.randn(3, 4), torch.randn(4)), verbose=True)
    err = capsys.readouterr().err
    for stage in ("capturing", "decomposing", "building graph", "compiling", "Kiln nodes", "arena"):
        assert stage in err, err


# --------------------------------------------------------------------------------------------------
# multi-method programs

class Enc(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, x):
        return x + self.w

    def decode(self, x):
        return torch.relu(x + self.w)


def test_export_program_shares_weights(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(256, 256)   # 256 KiB
    x = torch.randn(256, 256)
    m = Enc(w)
    other = Enc(w.clone())      # same bytes in another module: still stored once
    one = kiln.export(m, (x,), verbose=False)
    two = kiln.export_program({"encode": (m, (x,)), "decode": (other, (x,), "decode")},
                              out=tmp_path / "p.kiln", verbose=False)
    nbytes = w.numel() * 4
    assert one.file_size > nbytes
    assert two.file_size - one.file_size < nbytes // 4, (one.file_size, two.file_size)
    assert two.report["constant_bytes"] == nbytes
    prog = kiln.load(tmp_path / "p.kiln")
    assert sorted(prog.method_names) == ["decode", "encode"]
    assert_close(prog.run(x, method="encode")[0], (x + w).numpy())
    assert_close(prog.run(x, method="decode")[0], torch.relu(x + w).numpy())


# --------------------------------------------------------------------------------------------------
# errors

class Inv(nn.Module):
    def forward(self, x):
        return torch.linalg.inv(x)


class FFT(nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).real


class WithBlocks(nn.Module):
    def __init__(self, bad):
        super().__init__()
        self.blocks = nn.Sequential(nn.ReLU(), bad, nn.ReLU())

    def forward(self, x):
        return self.blocks(x + 1)


@pytest.mark.parametrize("bad,opname", [(Inv(), "linalg_inv"), (FFT(), "fft")])
def test_unsupported_op_names_op_and_module(bad, opname):
    with pytest.raises(ExportError) as ei:
        kiln.export(WithBlocks(bad), (torch.randn(4, 4),), verbose=False)
    e = ei.value
    msg = str(e)
    assert opname in msg and "module 'blocks.1'" in msg and "docs/op-set.md" in msg, msg
    assert e.module_path == "blocks.1" and opname in e.op


@requires("aten.scaled_dot_product_attention")
def test_kiln_refusal_becomes_export_error():
    class Attn(nn.Module):
        def forward(self, q):
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)   # Kiln declines dropout

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attn()

        def forward(self, x):
            return self.attn(x)

    with pytest.raises(ExportError) as ei:
        kiln.export(M(), (torch.randn(1, 2, 4, 8),), verbose=False)
    e = ei.value
    assert e.code == "NotSupported" and e.module_path == "attn", str(e)
    assert "aten.scaled_dot_product_attention" in str(e) and "dropout_p" in str(e)


def test_backend_not_built_yet():
    missing = [b for b in ("vulkan", "mlx") if b not in kiln._kiln.backend_names()][0]
    with pytest.raises(ExportError, match=f"backend {missing} is not built into this Kiln"):
        kiln.export(AddRelu(), (torch.randn(3, 4), torch.randn(4)), backends=(missing,), verbose=False)
    with pytest.raises(ExportError, match="unknown backend 'cuda'"):
        kiln.export(AddRelu(), (torch.randn(3, 4), torch.randn(4)), backends=("cuda",), verbose=False)
    res = kiln.export(AddRelu(), (torch.randn(3, 4), torch.randn(4)), backends=("portable",), verbose=False)
    assert res.file_size > 0


def test_unsupported_dtype_input_rejected():
    with pytest.raises(ExportError, match="int16"):
        kiln.export(AddRelu(), (torch.ones(3, 4, dtype=torch.int16), torch.randn(4)), verbose=False)


def test_buffer_update_becomes_state():
    """A buffer forward updates is a state tensor of the program (kept in a session across calls;
    test_state_capture.py covers every update form), not an error as before issue 18."""
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(1))

        def forward(self, x):
            self.n.add_(1)
            return x + self.n

    r = kiln.export(Counter(), (torch.randn(3),), verbose=False)
    p = kiln.load_bytes(r.data)
    assert [s["name"] for s in p.states] == ["n"]
    x = np.zeros(3, np.float32)
    assert p.run(x)[0][0] == 1.0 and p.run(x)[0][0] == 2.0


def test_random_in_forward_rejected():
    class Noise(nn.Module):
        def forward(self, x):
            return x + torch.randn_like(x)

    with pytest.raises(ExportError, match="random"):
        kiln.export(Noise(), (torch.randn(3),), verbose=False)


def test_training_mode_is_restored():
    m = AddRelu().train()
    kiln.export(m, (torch.randn(3, 4), torch.randn(4)), verbose=False)
    assert m.training


def test_decomposition_table_keeps_composites_whole():
    t = decomposition_table()
    A = torch.ops.aten
    for op in (A.group_norm.default, A.layer_norm.default, A.rms_norm.default, A.upsample_nearest2d.vec,
               A.upsample_bilinear2d.vec, A.hardswish.default, A.hardsigmoid.default, A.gelu.default,
               A.silu.default, A.scaled_dot_product_attention.default, A.linear.default):
        assert op not in t, op
    assert A.addcmul.default in t   # ordinary decompositions remain


# --------------------------------------------------------------------------------------------------
# op families (run once the ops are built)

ELEMENTWISE = ["aten.sub", "aten.mul", "aten.div", "aten.pow", "aten.neg", "aten.exp", "aten.log", "aten.sqrt",
               "aten.rsqrt", "aten.abs", "aten.reciprocal", "aten.erf", "aten.sin", "aten.cos", "aten.sigmoid",
               "aten.tanh", "aten.silu", "aten.hardswish", "aten.hardsigmoid", "aten.hardtanh",
               "aten.leaky_relu", "aten.gelu", "aten.clamp", "aten.where", "aten.gt", "aten.eq",
               "aten.logical_and", "aten.logical_not", "aten._to_copy"]


class Elementwise(nn.Module):
    def forward(self, x, y):
        a = x - y * 2 + x / (y.abs() + 1) + torch.div(x, y.abs() + 0.5, rounding_mode="floor")
        a = a + torch.div(x * 3, y.abs() + 0.5, rounding_mode="trunc") + (x.abs() + 0.1) ** y.clamp(-2, 2)
        b = (-x).exp() + (x.abs() + 1).log() + x.abs().sqrt() + (x.abs() + 1).rsqrt() + (x.abs() + 1).reciprocal()
        b = b + torch.erf(x) + x.sin() + y.cos() + torch.sigmoid(x) + torch.tanh(y)
        c = F.silu(x) + F.hardswish(y) + F.hardsigmoid(x) + F.relu6(y * 4) + F.hardtanh(x, -0.5, 0.7)
        c = c + F.leaky_relu(x, 0.2) + F.gelu(x) + F.gelu(y, approximate="tanh") + x.clamp(min=-0.3)
        m = (x > y) & ~(x == 0)
        d = torch.where(m, x, y) + m.float() + torch.where(x < 0, 0.0, x) + (x <= 0.1).to(torch.float32)
        return a, b, c, d


@requires(*ELEMENTWISE)
def test_elementwise_family():
    torch.manual_seed(0)
    export_and_run(Elementwise(), (torch.randn(2, 3, 4), torch.randn(3, 4)))


REDUCTION_SHAPE = ["aten.mean", "aten.sum", "aten.amax", "aten.amin", "aten.argmax", "aten._softmax",
                   "aten._log_softmax", "aten.view", "aten.permute", "aten.transpose", "aten.expand",
                   "aten.slice", "aten.select", "aten.squeeze", "aten.unsqueeze", "aten.cat", "aten.embedding",
                   "aten.constant_pad_nd"]


class ReductionShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, x, idx):
        r = x.mean(dim=(1, 2), keepdim=True) + x.sum(-1).unsqueeze(-1).unsqueeze(1) + x.amax(dim=1, keepdim=True)
        r = r + x.amin(dim=-1, keepdim=True)
        s = torch.softmax(x, dim=-1) + torch.log_softmax(x, dim=1)
        v = x.reshape(2, 12).view(2, 3, 4).permute(2, 0, 1).transpose(0, 2).contiguous()
        e = x[:, :1, :].expand(2, 3, 4) + x[:, 1] .unsqueeze(1) + x[..., 1:3].sum(-1, keepdim=True)
        c = torch.cat([x, v.permute(1, 0, 2)], dim=1).unsqueeze(0).squeeze()
        p = F.pad(x, (1, 2, 0, 1), value=0.5)
        a = x.argmax(dim=-1)
        return r + s + e, c, p, a, self.emb(idx), x.flatten().mean()


@requires(*REDUCTION_SHAPE)
def test_reduction_shape_family():
    torch.manual_seed(0)
    export_and_run(ReductionShape(), (torch.randn(2, 3, 4), torch.tensor([[1, 9, 0], [3, 3, 7]])))


class Views(nn.Module):
    """Views, non-contiguous intermediates and slice assignment."""

    def forward(self, x):
        t = x.transpose(1, 2).contiguous()
        p = x.permute(2, 0, 1)
        y = x.clone()
        y[:, 0] = 0
        y[:, 1:3] = y[:, 1:3] * 2
        y[..., -1] += 1
        q, k = x.chunk(2, dim=-1)
        u = x.unbind(0)[1]
        return t.reshape(-1), p + 1, y, q * k, u


@requires("aten.transpose", "aten.permute", "aten.view", "aten.slice", "aten.select", "aten.cat",
          "aten.unsqueeze", "aten.squeeze", "aten.mul", "aten.where", "aten.eq", "aten.expand")
def test_views_and_slice_assignment():
    export_and_run(Views(), (torch.randn(2, 4, 6),))


@requires("aten.slice", "aten.cat", "aten.view")
def test_roll_as_slices():
    class Roll(nn.Module):
        def forward(self, x):
            return (torch.roll(x, shifts=(2, -1), dims=(1, 2)), torch.roll(x, 5), torch.roll(x, 7, dims=-1),
                    torch.roll(x, 0, dims=0))

    export_and_run(Roll(), (torch.randn(2, 5, 3),))


@requires("aten.upsample_nearest2d", "aten.upsample_bilinear2d", "aten.unsqueeze", "aten.squeeze")
def test_upsample_1d_via_2d():
    class Up(nn.Module):
        def forward(self, x):
            return (F.interpolate(x, scale_factor=2.5, mode="nearest"), F.interpolate(x, size=11, mode="linear"),
                    F.interpolate(x, scale_factor=0.7, mode="linear", align_corners=True))

    export_and_run(Up(), (torch.randn(2, 3, 7),))


class Rewrites(nn.Module):
    """ATen ops outside Kiln's set that the capture rewrites exactly onto Kiln ops."""

    def forward(self, x, y, i):
        mx = torch.max(x, 1)
        mn = torch.min(x, -1, keepdim=True)
        return (mx.values, mx.indices, mn.values, mn.indices, x.max(), x.min(), torch.maximum(x, y),
                torch.minimum(x, y), x.clamp(min=y, max=y + 0.5), x.var(1), x.std(-1, keepdim=True),
                *torch.var_mean(x, 0, correction=0), x.index_select(1, i), x[:, i], x[i], x[:, torch.tensor([-1, 0])],
                x.flip(0, 1), x.repeat(2, 1, 3), torch.roll(x, 1, 0))


@requires("aten.amax", "aten.amin", "aten.argmax", "aten.neg", "aten.where", "aten.gt", "aten.lt", "aten.ne",
          "aten.mean", "aten.sub", "aten.mul", "aten.sum", "aten.div", "aten.sqrt", "aten.embedding",
          "aten.permute", "aten.view", "aten.expand")
def test_exact_rewrites():
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    export_and_run(Rewrites(), (x, y, torch.tensor([2, 0, 2])))
    x[0, 1], y[1, 2] = float("nan"), float("nan")   # NaN propagation of maximum/minimum/clamp
    res = export_and_run(Rewrites(), (x, y, torch.tensor([1, 1, 0])))
    with pytest.raises(kiln.KilnError, match="InvalidArgument"):   # indices are bound-checked at run time
        kiln.load_bytes(res.data).run(x, y, torch.tensor([1, 7, 0]))


CONV_LINEAR_POOL = ["aten.convolution", "aten.linear", "aten.addmm", "aten.mm", "aten.bmm", "aten.max_pool2d",
                    "aten.avg_pool2d", "aten.adaptive_avg_pool2d", "aten.view", "aten.permute"]


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8, bias=False)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.c1d = nn.Conv1d(4, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.avg = nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False)
        self.fc = nn.Linear(6 * 4, 5)

    def forward(self, x, a, b):
        y = torch.relu(self.c1(x))
        y = self.dw(y)
        z = self.up(y)
        y = self.pool(y) + self.avg(y)[..., :4, :4]
        g = F.adaptive_avg_pool2d(y, (2, 2))
        s = self.c1d(z.mean(-1))
        h = self.fc(s[..., :4].flatten(1))
        return g, h, torch.bmm(a, b), a[0] @ b[0], torch.addmm(h[:, :3], a[0, :2], b[0, :, :3])


@requires(*CONV_LINEAR_POOL)
def test_conv_linear_pool_family():
    torch.manual_seed(0)
    export_and_run(ConvNet(), (torch.randn(2, 3, 16, 16), torch.randn(2, 3, 5), torch.randn(2, 5, 3)))


NORM_UPSAMPLE_ATTN = ["aten.native_batch_norm", "aten.native_group_norm", "aten.native_layer_norm",
                      "aten.rms_norm", "aten.upsample_nearest2d", "aten.upsample_bilinear2d",
                      "aten.scaled_dot_product_attention", "aten.permute", "aten.view"]


class NormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(4, 8)
        self.ln = nn.LayerNorm(8)
        self.rms = nn.RMSNorm(8)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            for p in (self.bn.weight, self.bn.bias, self.gn.weight, self.gn.bias, self.ln.weight, self.rms.weight):
                p.uniform_(-1.5, 1.5)

    def forward(self, x, q, k, v, mask):
        y = self.gn(self.bn(x))
        n = F.interpolate(y, scale_factor=2, mode="nearest")
        b = F.interpolate(y, size=(7, 5), mode="bilinear", align_corners=False)
        c = F.interpolate(y, scale_factor=1.5, mode="bilinear", align_corners=True)
        t = self.rms(self.ln(y.permute(0, 2, 3, 1)))
        a1 = F.scaled_dot_product_attention(q, k, v)
        a2 = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        a3 = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
        return n, b, c, t, a1, a2, a3


@requires(*NORM_UPSAMPLE_ATTN)
def test_norm_upsample_attention_family():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mask = torch.randn(5, 5)
    export_and_run(NormNet(), (torch.randn(2, 8, 6, 4), q, k, v, mask))


@requires("aten.max_pool2d")
def test_max_pool_indices_rejected():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = nn.MaxPool2d(2, return_indices=True)

        def forward(self, x):
            y, idx = self.pool(x)
            return y, idx

    with pytest.raises(ExportError, match="output 1 of aten.max_pool2d_with_indices"):
        kiln.export(M(), (torch.randn(1, 2, 4, 4),), verbose=False)


# --------------------------------------------------------------------------------------------------
# whole models

MV3_OPS = ["aten.convolution", "aten.native_batch_norm", "aten.hardswish", "aten.hardsigmoid", "aten.relu",
           "aten.mean", "aten.mul", "aten.add", "aten.view", "aten.linear", "aten.adaptive_avg_pool2d"]


@requires(*MV3_OPS)
def test_mobilenet_v3_small_matches_eager():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    res = kiln.export(model, (x,), verbose=False)
    (got,) = kiln.load_bytes(res.data).run(x)
    with torch.no_grad():
        ref = model(x).numpy()
    assert got.shape == (1, 1000)
    err = float(np.abs(got - ref).max())
    assert err <= 1e-4, f"max abs logit diff {err:.3e}"


@requires("aten.convolution", "aten.native_batch_norm", "aten.relu", "aten.max_pool2d", "aten.add",
          "aten.adaptive_avg_pool2d", "aten.view", "aten.linear")
def test_resnet18_matches_eager():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    res = kiln.export(model, (x,), verbose=False)
    (got,) = kiln.load_bytes(res.data).run(x)
    with torch.no_grad():
        ref = model(x).numpy()
    err = float(np.abs(got - ref).max())
    assert err <= 1e-4 * max(1.0, float(np.abs(ref).max())), f"max abs logit diff {err:.3e}"


@requires(*MV3_OPS)
def test_cli_export(tmp_path):
    out = tmp_path / "mv3.kiln"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-m", "kiln", "export", "--model", "mobilenet_v3_small",
                        "--input-shape", "1x3x96x96", "-o", str(out)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "seeded random weights" in r.stderr and "labels are meaningless" in r.stderr
    assert re.search(r"wrote .*mv3\.kiln", r.stderr)
    prog = kiln.load(out)
    assert prog.method("forward").inputs[0]["sizes"] == [1, 3, 96, 96]
    torch.manual_seed(0)
    import torchvision
    model = torchvision.models.mobilenet_v3_small(weights=None).eval()
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        assert float(np.abs(prog.run(x)[0] - model(x).numpy()).max()) <= 1e-4


def test_cli_errors(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    base = [sys.executable, "-m", "kiln", "export", "-o", str(tmp_path / "x.kiln")]
    r = subprocess.run(base + ["--model", "resnet18", "--backends", "vulkan"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "backend vulkan is not built into this Kiln" in r.stderr
    r = subprocess.run(base + ["--model", "no_such_net"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown torchvision model 'no_such_net'" in r.stderr
    r = subprocess.run(base + ["--model", "resnet18", "--input-shape", "1x3xfoo"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "bad shape" in r.stderr


@requires(*MV3_OPS, "aten.max_pool2d")
def test_mv3_example_isolates_failures(tmp_path):
    import torchvision
    bad = tmp_path / "bad.pt"
    torch.save(torchvision.models.mobilenet_v3_small(weights=None).state_dict(), bad)  # wrong model
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "mv3", "export.py"), "--out-dir",
                        str(tmp_path), "--models", "resnet18", "mobilenet_v3_small", "--input-shape", "1x3x64x64",
                        "--weights", f"resnet18={bad}"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    failed = [line for line in r.stderr.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and failed[0].startswith("resnet18 (portable): FAILED"), r.stderr
    assert (tmp_path / "mv3_portable.kiln").exists() and not (tmp_path / "resnet18_portable.kiln").exists()
    assert "mobilenet_v3_small: wrote" in r.stdout
