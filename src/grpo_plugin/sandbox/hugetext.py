"""The interpreter's code on huge pages, set up once in the fork server before it forks its templates.

Each program's process is new: it would fault the interpreter's code in again, 4 KiB at a time (~50 faults, each
mapping and later unmapping up to 16 pages: ~0.1 ms of every process on the machines measured). Instead, the
aligned 2 MiB spans of the interpreter's read-only segments (libpython's code, its symbol tables and read-only
data) are copied into anonymous memory that the kernel backs with transparent huge pages, made read + execute,
and moved over the original in one `mremap`: the same bytes at the same addresses. A process forked afterwards
shares those huge pages with one page-table entry per 2 MiB and takes no fault on them. Where the kernel gives
no huge pages (transparent huge pages off, no 2 MiB span inside the segments), nothing is changed.

Standard library only (it runs inside the jail). Single-threaded callers only: the code being replaced is the
code that runs the replacement, which is safe because the bytes are the same and no other thread runs.
"""

from __future__ import annotations

try:
    from . import libc as _c
except ImportError:  # in the jail: a top-level module beside forkserver.py
    import libc as _c

HUGE = 2 << 20
_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_MAP_PRIVATE_ANON = 0x02 | 0x20
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_MREMAP_MAYMOVE_FIXED = 1 | 2


class _Libc:
    def __init__(self):
        ptr, size, i = _c.c_void_p, _c.c_size_t, _c.c_int
        self.mmap = _c.function("mmap", ptr, [ptr, size, i, i, i, _c.c_long])
        self.mremap = _c.function("mremap", ptr, [ptr, size, size, i, ptr])
        self.madvise = _c.function("madvise", i, [ptr, size, i])
        self.mprotect = _c.function("mprotect", i, [ptr, size, i])
        self.munmap = _c.function("munmap", i, [ptr, size])
        self.memmove = _c.function("memmove", ptr, [ptr, ptr, size])


def read_only_span(address: int, maps_text: str) -> tuple[int, int] | None:
    """The 2 MiB-aligned span inside the read-only segments that start the object mapped at `address` (its first
    segments, contiguous and not writable), or None when no whole 2 MiB fits there."""
    rows = []
    for line in maps_text.splitlines():
        parts = line.split()
        if len(parts) >= 6:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            rows.append((lo, hi, parts[1], parts[5]))
    path = next((p for lo, hi, _, p in rows if lo <= address < hi), None)
    if path is None or not path.startswith("/"):
        return None
    segments = [(lo, hi, perms) for lo, hi, perms, p in rows if p == path]
    start = end = segments[0][0]
    for lo, hi, perms in segments:
        if lo != end or "w" in perms or perms[3] != "p":
            break
        end = hi
    lo, hi = -(-start // HUGE) * HUGE, end // HUGE * HUGE
    return (lo, hi) if hi > lo else None


def huge_kb(lo: int, smaps_text: str) -> int:
    """AnonHugePages of the mapping that starts at `lo`."""
    head, found = f"{lo:x}-", False
    for line in smaps_text.splitlines():
        if line.startswith(head):
            found = True
        elif found and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def _all_huge(lo: int, size: int) -> bool:
    with open("/proc/self/smaps") as f:
        return huge_kb(lo, f.read()) * 1024 >= size


def remap_interpreter() -> int:
    """Put the interpreter's read-only span on huge pages; the bytes moved (0: left as it was)."""
    pyfunc = _c.address("Py_IncRef")
    with open("/proc/self/maps") as f:
        span = read_only_span(pyfunc, f.read())
    if span is None:
        return 0
    lo, hi = span
    size = hi - lo
    libc = _Libc()
    raw = libc.mmap(None, size + HUGE, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE_ANON, -1, 0)
    if raw is None or raw == _c.c_void_p(-1).value:
        return 0
    new = -(-raw // HUGE) * HUGE
    keep = False
    try:
        libc.madvise(new, size, _MADV_HUGEPAGE)
        libc.memmove(new, lo, size)
        if not _all_huge(new, size):
            libc.madvise(new, size, _MADV_COLLAPSE)  # Linux >= 6.1; fails harmlessly before
            if not _all_huge(new, size):
                return 0  # no huge pages to be had: 4 KiB anonymous pages would only cost more
        if libc.mprotect(new, size, _PROT_READ | _PROT_EXEC) != 0:
            return 0
        if libc.mremap(new, size, size, _MREMAP_MAYMOVE_FIXED, lo) != lo:
            return 0
        keep = True
        return size
    finally:
        if not keep:
            libc.munmap(new, size)
        if new > raw:
            libc.munmap(raw, new - raw)
        libc.munmap(new + size, raw + HUGE - new)  # the rest of the alignment slack (never empty)
