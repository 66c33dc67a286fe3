"""The optimized cpu kernels (src/kernels/cpu: GEMM-based / depthwise convolution, linear, mm,
bmm, addmm) against PyTorch eager, through kiln.export, with the same program loaded with
portable_kernels_only=True (reference kernels) and False (cpu kernels), at 1 and 2 threads.

fp32 tolerance: max abs error <= 1e-5 * max|expected| (scaled up for long reductions).
"""
import os

import numpy as np
import pytest
import torch

import kiln
from oprunner import assert_close

torch.set_num_threads(1)


class ConvNet(torch.nn.Module):
    """Every conv path: 3x3 stride-2 stem (im2col), depthwise 5x5 with dilation, 1x1 (direct
    GEMM), grouped 3x3, depthwise multiplier 2, then a 1-D conv, linear and bmm/addmm."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 24, 3, stride=2, padding=1)
        self.dw = torch.nn.Conv2d(24, 24, 5, padding=4, dilation=2, groups=24)
        self.pw = torch.nn.Conv2d(24, 36, 1)
        self.grouped = torch.nn.Conv2d(36, 48, 3, stride=(2, 1), padding=(1, 2), groups=3, bias=False)
        self.dw2 = torch.nn.Conv2d(48, 96, 3, stride=2, padding=1, groups=48)
        self.conv1d = torch.nn.Conv1d(96, 40, 3, padding=1)
        self.fc = torch.nn.Linear(40, 29)
        self.w = torch.nn.Parameter(torch.randn(29, 17) * 0.2)
        self.b = torch.nn.Parameter(torch.randn(17))

    def forward(self, x):
        y = torch.relu(self.stem(x))
        y = self.dw(y)
        y = torch.relu(self.pw(y))
        y = self.grouped(y)
        y = self.dw2(y)                      # [N, 96, h, w]
        y = y.flatten(2)                     # [N, 96, h*w]
        y = self.conv1d(y)                   # [N, 40, L]
        y = self.fc(y.transpose(1, 2))       # [N, L, 29] (linear on a 3-D input)
        z = torch.bmm(y, y.transpose(1, 2))  # [N, L, L]
        flat = y.reshape(-1, 29)
        return z, torch.addmm(self.b, flat, self.w)


class DeepSmallPlane(torch.nn.Module):
    """More output channels than output pixels (a late ResNet stage): the GEMMs split along M,
    with the im2col matrix (and a plain mm's B) packed once for both threads."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 264, 3, padding=1)          # M 264 > N 100, K 576
        self.conv2 = torch.nn.Conv2d(264, 300, 3, stride=2, padding=1)  # M 300 > N 25, K 2376
        self.w = torch.nn.Parameter(torch.randn(25, 40) * 0.2)

    def forward(self, x):
        y = self.conv2(torch.relu(self.conv(x)))                    # [N, 300, 5, 5]
        flat = y.flatten(2)                                          # [N, 300, 25]
        return torch.matmul(flat[0], flat[0].t() @ flat[0]) @ self.w  # mm with M 300 > N


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(300, 257)
        self.l2 = torch.nn.Linear(257, 1000)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


CASES = {
    "convnet": (ConvNet, lambda: torch.randn(2, 3, 41, 37)),
    "deep_small_plane": (DeepSmallPlane, lambda: torch.randn(1, 64, 10, 10)),
    "mlp_batch1": (Mlp, lambda: torch.randn(1, 300)),
    "mlp_batch5": (Mlp, lambda: torch.randn(5, 300)),
    # Weights packed at load (linear_prepare); large enough for the pool: split along N with A
    # packed once for all parts (77 rows, as a text encoder), and along M (300 rows > 257).
    "mlp_rows77": (Mlp, lambda: torch.randn(1, 77, 300)),
    "mlp_rows300": (Mlp, lambda: torch.randn(300, 300)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request):
    torch.manual_seed(0)
    cls, make_input = CASES[request.param]
    model = cls().eval()
    x = make_input()
    with torch.no_grad():
        expected = model(x)
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    res = kiln.export(model, (x,), verbose=False)
    return res.data, x.numpy(), [e.numpy() for e in expected]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("portable", [True, False])
def test_matches_eager(exported, portable, threads):
    data, x, expected = exported
    prog = kiln.load_bytes(data, num_threads=threads, portable_kernels_only=portable)
    outs = prog.run(x)
    assert len(outs) == len(expected)
    for i, (o, e) in enumerate(zip(outs, expected)):
        assert_close(o, e, rel=3e-5, what=f"output {i} (portable={portable}, threads={threads})")


def test_cpu_and_portable_differ_but_agree(exported):
    """The cpu kernels really run (fp32 FMA sums differ in the last bits from the portable
    kernels' double sums) and agree with the portable kernels closely."""
    data, x, _ = exported
    a = kiln.load_bytes(data, num_threads=1, portable_kernels_only=True).run(x)
    b = kiln.load_bytes(data, num_threads=2, portable_kernels_only=False).run(x)
    assert any(not np.array_equal(o1, o2) for o1, o2 in zip(a, b)), "cpu kernels were not selected"
    for o1, o2 in zip(a, b):
        assert_close(o2, o1, rel=3e-5)


# (in shape, out channels, kernel, stride, padding, output_padding, dilation, groups, bias)
CONV_T_CASES = [
    ((1, 8, 7, 9), 4, (2, 2), (2, 2), (0, 0), (0, 0), (1, 1), 1, True),    # PP-OCR det's 2x2/2 upsampling
    ((2, 6, 5, 4), 9, (3, 3), (2, 1), (1, 0), (1, 0), (1, 1), 3, False),   # grouped, output_padding
    ((1, 4, 6, 6), 4, (4, 3), (3, 2), (2, 1), (2, 1), (1, 2), 1, True),    # dilation, large padding
    ((1, 5, 3, 3), 7, (5, 5), (1, 1), (3, 2), (0, 0), (1, 1), 1, True),    # padding crops to 1x3
    ((1, 16, 10, 10), 16, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 16, True),  # depthwise transposed
    ((2, 3, 11), 5, (4,), (3,), (2,), (1,), (1,), 1, True),               # 1-D
]


@pytest.mark.parametrize("case", CONV_T_CASES, ids=[f"t{i}" for i in range(len(CONV_T_CASES))])
@pytest.mark.parametrize("threads", [1, 2])
def test_transposed_convolution_matches_eager(case, threads):
    """The cpu kernel's GEMM + col2im transposed convolution (with a fused relu) against eager,
    and the same program on the portable kernels."""
    shape, cout, k, s, p, op, d, groups, bias = case
    conv_cls = torch.nn.ConvTranspose1d if len(shape) == 3 else torch.nn.ConvTranspose2d
    torch.manual_seed(7)
    conv = conv_cls(shape[1], cout, k, stride=s, padding=p, output_padding=op, dilation=d, groups=groups,
                    bias=bias).eval()
    model = torch.nn.Sequential(conv, torch.nn.ReLU()).eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = model(x).numpy()
    data = kiln.export(model, (x,), verbose=False).data
    fast = kiln.load_bytes(data, num_threads=threads).run(x.numpy())[0]
    ref = kiln.load_bytes(data, num_threads=1, portable_kernels_only=True).run(x.numpy())[0]
    assert_close(fast, expected, rel=1e-5, what=f"cpu transposed conv {case}")
    assert_close(ref, expected, rel=1e-5, what=f"portable transposed conv {case}")
    # the cpu kernel took the convolution (and the relu into its stores)
    assert kiln.load_bytes(data, num_threads=threads).method().num_fused_instructions == 1


def _mapping_rss_kib(path: str) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    real = os.path.realpath(path)
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's header line
                inside = len(head) >= 6 and os.path.realpath(head[5]) == real
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


@pytest.mark.parametrize("threads", [1, 2])
def test_linear_weights_packed_at_load(tmp_path, threads):
    """Linear weights are packed once at load (as the GEMM's B panels) and the file's pages of
    those weights are dropped; a one-row input (the matrix-vector path, which reads the weight
    itself) keeps them. Results match eager either way."""
    torch.manual_seed(4)
    model = torch.nn.Sequential(*[torch.nn.Linear(520, 520) for _ in range(4)]).eval()  # 4.3 MB
    for rows in (77, 1):
        x = torch.randn(1, rows, 520)
        path = str(tmp_path / f"linears{rows}.kiln")
        kiln.export(model, (x,), out=path, verbose=False)
        prog = kiln.load(path, num_threads=threads)
        packed = prog.method().prepared_bytes
        resident = _mapping_rss_kib(path) * 1024
        with torch.no_grad():
            expected = model(x).numpy()
        assert_close(prog.run(x.numpy())[0], expected, rel=1e-5, what=f"{rows} rows, {threads} threads")
        if rows > 1:
            assert packed > 4 * 520 * 520 * 4, packed
            assert resident < 0.25 * os.path.getsize(path), (resident, os.path.getsize(path))
        else:
            assert packed == 0, packed


def test_packed_weights_do_not_stay_resident_twice(tmp_path):
    """Convolution weights packed at load are the only copy the cpu kernel reads: the file's pages
    of those weights are dropped from memory (re-read from the file if anything reads them), so a
    program's resident size does not hold every weight twice. Results still match eager."""
    torch.manual_seed(3)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Conv2d(256, 256, 3, padding=1), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).eval()  # 9.4 MB of weights
    x = torch.randn(1, 256, 6, 6)
    path = str(tmp_path / "convs.kiln")
    kiln.export(model, (x,), out=path, verbose=False)
    prog = kiln.load(path, num_threads=1)
    method = prog.method()
    assert method.prepared_bytes > 9_000_000
    resident = _mapping_rss_kib(path) * 1024
    assert resident < 0.25 * os.path.getsize(path), (resident, os.path.getsize(path))
    with torch.no_grad():
        expected = model(x).numpy()
    assert_close(prog.run(x.numpy())[0], expected, rel=1e-5, what="convs with released weight pages")

    # Weights stored as float16 are widened once at load: the file's float16 pages are dropped too.
    path16 = str(tmp_path / "convs_fp16.kiln")
    kiln.export(model, (x,), out=path16, verbose=False, weights_dtype="float16")
    prog16 = kiln.load(path16, num_threads=1)
    resident = _mapping_rss_kib(path16) * 1024
    assert resident < 0.25 * os.path.getsize(path16), (resident, os.path.getsize(path16))
    with torch.no_grad():
        y = x
        for m in layers:  # eager with each conv weight rounded to float16 (biases stay float32)
            y = (torch.nn.functional.conv2d(y, m.weight.half().float(), m.bias, padding=1)
                 if isinstance(m, torch.nn.Conv2d) else m(y))
        expected16 = y.numpy()
    assert_close(prog16.run(x.numpy())[0], expected16, rel=1e-5, what="float16-stored convs, pages released")


@pytest.mark.parametrize("case", [
    # (input shape, kernel, stride, padding, dilation, ceil_mode)
    ((1, 64, 112, 112), (3, 3), (2, 2), (1, 1), (1, 1), False),   # resnet18's stem pool
    ((1, 200, 2, 96), (2, 2), (2, 2), (0, 0), (1, 1), False),     # PP-OCR cls
    ((2, 3, 7, 5), (3, 2), (1, 2), (1, 1), (1, 1), True),
    ((3, 9, 13), (2, 3), (3, 1), (1, 1), (2, 1), True),          # 3-D input, dilation
    ((1, 4, 6, 17), (1, 5), (1, 3), (0, 2), (1, 2), False),
    ((1, 2, 1, 1), (1, 1), (1, 1), (0, 0), (1, 1), False),
    # 3 wide, stride 2 (the vectorized horizontal pass): ceil_mode with the last window past the
    # row, no padding, odd widths; 2-row windows, 20 outputs per row (8-wide steps + a tail)
    ((1, 5, 17, 23), (3, 3), (2, 2), (0, 0), (1, 1), True),
    ((2, 3, 9, 40), (2, 3), (1, 2), (1, 1), (1, 1), False),
    ((1, 2, 5, 35), (3, 3), (2, 2), (1, 1), (2, 1), True),       # dilated rows only
])
@pytest.mark.parametrize("threads", [1, 2])
def test_max_pool2d_matches_eager(case, threads, tmp_path):
    """The cpu max_pool2d kernel (separable, AVX2) against eager, with NaN and -inf in the input
    (a NaN wins its windows, as in ATen), and bit-equal to the portable kernel."""
    shape, k, s, p, d, ceil = case
    x = torch.randn(*shape) * 3
    flat = x.view(-1)
    flat[:: 7] = float("-inf")
    flat[3:: 29] = float("nan")
    m = torch.nn.MaxPool2d(k, s, p, d, ceil_mode=ceil).eval()
    with torch.no_grad():
        want = m(x).numpy()
    data = kiln.export(m, (x,), verbose=False).data
    fast = kiln.load_bytes(data, num_threads=threads).run(x.numpy())[0]
    ref = kiln.load_bytes(data, portable_kernels_only=True).run(x.numpy())[0]
    np.testing.assert_array_equal(fast, want)
    np.testing.assert_array_equal(fast, ref)
    cli = os.path.join(os.path.dirname(__file__), "..", "..", "build", "tools", "kiln")
    if os.path.isfile(cli):  # the cpu kernel took the call
        import json
        import subprocess
        (tmp_path / "pool.kiln").write_bytes(data)
        r = subprocess.run([cli, "bench", str(tmp_path / "pool.kiln"), "--runs", "1", "--warmup", "0", "--json"],
                           capture_output=True, text=True, check=True)
        assert json.loads(r.stdout)["cpu_kernel_calls"] == 1, r.stdout
