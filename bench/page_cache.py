#!/usr/bin/env python3
"""Page-cache state of model files, for benchmarks that stream weights (bench/llm.py).

On Linux 6.x a file the page cache holds in 2 MiB folios is mapped with 2 MiB pages (one TLB entry
per 2 MiB); one held in small folios is mapped with 4 KiB pages. A decode step that streams every
weight, or a GEMM that packs panels from rows a few KiB apart, then takes a TLB miss every 4 KiB
(on a VM, a two-level page walk). Which folios a file gets depends on how it was read in and on how
fragmented memory was then, not on the engine that maps it.

    python bench/page_cache.py FILE...     # prints each file's share in 2 MiB folios (populating it)
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
    """Share (0..1) of the file's bytes that the page cache holds in PMD-mappable (2 MiB) folios:
    the file is mapped read-only, populated (MADV_POPULATE_READ, reading from disk what is not
    cached), and this process's FilePmdMapped (/proc/self/smaps_rollup, KiB) read before and after.
    The mapping counts in this process's peak RSS: call it in a child (huge_folio_share_of).
    None where that cannot be measured (not Linux 5.14+, or the file is under 2 MiB)."""
    size = os.path.getsize(path)
    if size < 2 << 20 or not os.path.exists("/proc/self/smaps_rollup"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot_read, map_private, madv_populate_read = 1, 2, 22  # <sys/mman.h>, Linux
    fd = os.open(path, os.O_RDONLY)
    try:
        before = _pmd_mapped_kib()
        addr = libc.mmap(None, size, prot_read, map_private, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            if libc.madvise(addr, size, madv_populate_read) != 0:
                return None
            return min(1.0, (_pmd_mapped_kib() - before) * 1024 / size)
        finally:
            libc.munmap(addr, size)
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
    as_json = argv[:1] == ["--json"]
    paths = argv[1:] if as_json else argv
    if not paths:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    shares = [huge_folio_share(p) for p in paths]
    if as_json:
        print(json.dumps(shares))
    else:
        for p, h in zip(paths, shares):
            print(f"{'–' if h is None else f'{h:.0%}'}  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
