#!/usr/bin/env python3
"""Page-cache state of model files, for benchmarks that stream weights (bench/llm.py).

On Linux 6.x a file the page cache holds in 2 MiB folios is mapped with 2 MiB pages (one TLB entry
per 2 MiB); one held in small folios is mapped with 4 KiB pages. A decode step that streams every
weight, or a GEMM that packs panels from rows a few KiB apart, then takes a TLB miss every 4 KiB
(on a VM, a two-level page walk). Which folios a file gets depends on how it was read in and on how
fragmented memory was then, not on the engine that maps it.

    python bench/page_cache.py FILE...     # each file's share in 2 MiB folios (reads in what is not cached)
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys


def engine_file_paths(path: str) -> list:
    """The regular files of one engine's model: path itself, or every file under a folder (a
    checkpoint folder), sorted; [] when path does not exist."""
    if os.path.isdir(path):
        return sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names)
    return [path] if os.path.isfile(path) else []


def prepare(paths: list) -> bool:
    """Evicts the cached pages of every file in paths (posix_fadvise DONTNEED; pages another
    process maps stay), compacts memory where /proc/sys/vm/compact_memory is writable (root), and
    reads the files back in (8 MiB reads), so that the next run finds them cached, read in the same
    way whichever engine maps them, in 2 MiB folios where the kernel could allocate them. Returns
    whether memory was compacted. OSError from reading a file propagates."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    compacted = False
    try:
        with open("/proc/sys/vm/compact_memory", "w") as fh:
            fh.write("1\n")
        compacted = True
    except OSError:
        pass
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            while fh.read(8 << 20):
                pass
    return compacted


def _pmd_mapped_kib() -> int:
    with open("/proc/self/smaps_rollup") as fh:
        for line in fh:
            if line.startswith("FilePmdMapped:"):
                return int(line.split()[1])
    return 0


def huge_folio_share(path: str) -> float | None:
    """Share (0..1) of the file's whole 2 MiB pieces that the page cache holds in PMD-mappable
    (2 MiB) folios (a tail under 2 MiB can never be one and is not counted): the file is mapped
    read-only as Kiln's loader maps it (at a 2 MiB-aligned address, advised MADV_HUGEPAGE),
    populated (MADV_POPULATE_READ: what is not cached is read in now, as a cold load would), and
    this process's FilePmdMapped (/proc/self/smaps_rollup, KiB) read before and after. The mapping
    counts in this process's peak RSS: call it in a child (huge_folio_share_of). None where that
    cannot be measured (not Linux 5.14+, or the file is under 2 MiB). OSError if the file cannot be
    opened."""
    huge = 2 << 20
    size = os.path.getsize(path)
    if size < huge or not os.path.exists("/proc/self/smaps_rollup"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    # <sys/mman.h>, Linux
    prot_none, prot_read, map_private, map_fixed, map_anonymous, map_noreserve = 0, 1, 2, 0x10, 0x20, 0x4000
    madv_hugepage, madv_populate_read = 14, 22
    failed = ctypes.c_void_p(-1).value
    fd = os.open(path, os.O_RDONLY)
    try:
        before = _pmd_mapped_kib()
        span = size + huge  # reserve, map the file at the first aligned address, give the rest back
        reserve = libc.mmap(None, span, prot_none, map_private | map_anonymous | map_noreserve, -1, 0)
        if reserve in (None, failed):
            return None
        aligned = (reserve + huge - 1) // huge * huge
        addr = libc.mmap(aligned, size, prot_read, map_private | map_fixed, fd, 0)
        try:
            if addr in (None, failed):
                return None
            libc.madvise(addr, size, madv_hugepage)
            if libc.madvise(addr, size, madv_populate_read) != 0:
                return None
            return min(1.0, (_pmd_mapped_kib() - before) * 1024 / (size // huge * huge))
        finally:
            libc.munmap(reserve, span)
    finally:
        os.close(fd)


def huge_folio_share_of(paths: list) -> float | None:
    """Size-weighted huge_folio_share of several files (one model), measured in a child process so
    that the caller's peak RSS (which its own children inherit through fork) does not grow; None
    when no file could be measured."""
    if not paths:
        return None
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--json", *paths], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    shares = [(os.path.getsize(p), h) for p, h in zip(paths, json.loads(r.stdout)) if h is not None]
    return sum(n * h for n, h in shares) / sum(n for n, _ in shares) if shares else None


def main(argv: list) -> int:
    import argparse
    p = argparse.ArgumentParser(
        prog="bench/page_cache.py",
        description="Print the share of each file's whole 2 MiB pieces that the page cache holds in 2 MiB folios "
                    "(mapped with 2 MiB pages). Reads in what is not cached, as a cold load would. "
                    "'-' : not measured (under 2 MiB, not a regular file, or no /proc/self/smaps_rollup).")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="print one JSON list of shares (null: not measured)")
    a = p.parse_args(argv)
    shares = []
    for f in a.files:
        if not os.path.isfile(f):
            print(f"error: {f}: {'not a regular file' if os.path.exists(f) else 'no such file'}", file=sys.stderr)
            return 1
        try:
            shares.append(huge_folio_share(f))
        except OSError as e:
            print(f"error: {f}: {e.strerror or e}", file=sys.stderr)
            return 1
    if a.json:
        print(json.dumps(shares))
    else:
        for f, h in zip(a.files, shares):
            print(f"{'-' if h is None else f'{h:.0%}'}  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
