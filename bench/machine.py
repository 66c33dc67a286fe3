"""The CPU a benchmark ran on and the cpu kernel target Kiln chose there: one description that
bench/run.py (docs/benchmarks.md, results.json) and bench/diffusion.py (docs/diffusion.md) record.

    import machine                      # from a script in bench/
    d = machine.cpu_description()       # {"model", "cores", "simd", "kiln_cpu_target", ...}
    machine.cpu_summary(d)              # one line of Markdown

The SIMD feature list is the one scripts/test.sh prints (the same flags of /proc/cpuinfo, in the
kernel's order), so that a benchmark and a test run can be placed on the same kind of machine.
"""
from __future__ import annotations

import os
import platform
import re

# The /proc/cpuinfo flags that matter for Kiln's kernels and the engines it is compared with:
# x86 (SSE4.2, AVX, AVX2, FMA, F16C, every AVX-512 subset, AVX-VNNI, AMX) and Arm (ASIMD
# variants, SVE/SVE2, fp16, int8 matrix multiply, bf16). Keep in step with scripts/test.sh.
SIMD_FLAGS = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx512[a-z0-9_]*|avx_vnni|amx[a-z0-9_]*|asimd[a-z]*|"
                        r"sve[0-9a-z]*|fphp|i8mm|bf16)$")


def read_cpuinfo(text: str) -> tuple[str, list[str]]:
    """(model name, SIMD flags) from the text of /proc/cpuinfo: the first "model name" (x86),
    "Model name", "Hardware" or "CPU part" (Arm) line, and the flags of the first "flags" /
    "Features" line that SIMD_FLAGS matches, in their order there. ("", []) when absent."""
    model, flags = "", []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if not model and key in ("model name", "Model name", "Hardware", "CPU part"):
            model = value.strip()
        elif not flags and key in ("flags", "Features"):
            flags = [f for f in value.split() if SIMD_FLAGS.match(f)]
        if model and flags:
            break
    return model, flags


def kiln_cpu_target() -> dict:
    """What Kiln's Python binding says about its cpu kernel target in this process (the same build
    and environment as the `kiln` CLI the benchmarks start): {"kiln_cpu_target": name or None,
    "kiln_cpu_targets_available": [...], "kiln_cpu_target_env": KILN_CPU_TARGET or None, and
    "kiln_cpu_target_error": why there is no target (a refused KILN_CPU_TARGET, no binding)}."""
    out = {"kiln_cpu_target": None, "kiln_cpu_targets_available": [],
           "kiln_cpu_target_env": os.environ.get("KILN_CPU_TARGET") or None}
    try:
        import kiln
        out["kiln_cpu_targets_available"] = kiln.available_cpu_targets()
        out["kiln_cpu_target"] = kiln.cpu_target()
    except Exception as e:  # noqa: BLE001 - recorded, the caller decides
        # KilnError's args are (message, code name); the message starts with the code
        out["kiln_cpu_target_error"] = str(e.args[0]) if e.args else f"{type(e).__name__}: {e}"
    return out


def cpu_description(cpuinfo: str = "/proc/cpuinfo") -> dict:
    """{"model": CPU model name, "cores": os.cpu_count(), "machine": platform.machine(), "simd":
    space-separated SIMD flags (as scripts/test.sh prints them), plus kiln_cpu_target()'s keys}."""
    try:
        with open(cpuinfo) as f:
            model, flags = read_cpuinfo(f.read())
    except OSError:
        model, flags = "", []
    d = {"model": model or platform.processor() or "unknown", "cores": os.cpu_count(),
         "machine": platform.machine(), "simd": " ".join(flags) or "none found"}
    d.update(kiln_cpu_target())
    return d


def target_summary(d: dict) -> str:
    """ "avx3_dl (available: avx3_dl, avx3, avx2, scalar)" with "; set by KILN_CPU_TARGET" when the
    environment chose it (the wording of `kiln bench`'s "cpu target" line), or the error."""
    if d.get("kiln_cpu_target") is None:
        return f"unknown ({d.get('kiln_cpu_target_error', 'not recorded')})"
    s = f"{d['kiln_cpu_target']} (available: {', '.join(d.get('kiln_cpu_targets_available') or [])}"
    return s + ("; set by KILN_CPU_TARGET" if d.get("kiln_cpu_target_env") else "") + ")"


def cpu_summary(d: dict) -> str:
    """One line: "AMD EPYC 9R14 (2 cores, x86_64); SIMD: avx avx2 ...; Kiln cpu kernels: avx3_dl
    (available: ...)"."""
    return (f"{d.get('model', 'unknown')} ({d.get('cores', '?')} cores, {d.get('machine', '?')}); "
            f"SIMD: {d.get('simd', '?')}; Kiln cpu kernels: {target_summary(d)}")


# ---- machine state (shared by bench/llm_decode.py and bench/llm.py) ----

def _cpu_times() -> tuple[int, int]:
    """(total, idle + iowait) jiffies of all cores, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + (v[4] if len(v) > 4 else 0)


def cpu_busy(sample_s: float = 0.3) -> float:
    """Fraction of all cores busy (by any process) over sample_s seconds, from /proc/stat."""
    import time
    t0, i0 = _cpu_times()
    time.sleep(sample_s)
    t1, i1 = _cpu_times()
    return 0.0 if t1 == t0 else 1.0 - (i1 - i0) / (t1 - t0)


def wait_idle(threshold: float, max_wait_s: float) -> float:
    """Waits until the machine is busy less than `threshold` (a fraction of all cores; at most
    max_wait_s seconds); returns the last busy fraction seen."""
    import time
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy()
    while busy >= threshold and time.monotonic() < deadline:
        busy = cpu_busy()
    return busy
