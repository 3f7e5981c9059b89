"""The interpreter's code on huge pages in the fork server (sandbox/hugetext.py): which span is moved, and that the
fork server and the processes it forks really map it so, with the same bytes, while programs run as before."""

from __future__ import annotations

import ctypes
import os

import pytest

from grpo_plugin.sandbox import Sandbox, hugetext

MB = 1 << 20


def maps(*rows) -> str:
    return "\n".join(f"{lo:x}-{hi:x} {perms} 00000000 fe:00 1 {path}" for lo, hi, perms, path in rows)


LIB = "/usr/lib/libpython3.12.so.1.0"


def test_the_span_is_the_aligned_part_of_the_leading_read_only_segments():
    base = 0x7F0000000000
    text = maps((base, base + MB, "r--p", LIB), (base + MB, base + 3 * MB + 4096, "r-xp", LIB),
                (base + 3 * MB + 4096, base + 5 * MB, "r--p", LIB), (base + 5 * MB, base + 6 * MB, "rw-p", LIB),
                (base + 6 * MB, base + 9 * MB, "r--p", LIB))  # read-only again after the writable one: not taken
    assert hugetext.read_only_span(base + MB + 10, text) == (base, base + 4 * MB)
    assert hugetext.read_only_span(base + 5, text) == (base, base + 4 * MB)
    unaligned = base + 0x106000
    text = maps((unaligned, unaligned + 3 * MB, "r-xp", LIB))
    assert hugetext.read_only_span(unaligned + 5, text) == (base + 2 * MB, base + 2 * MB + 2 * MB)
    assert hugetext.read_only_span(unaligned + 5, maps((unaligned, unaligned + 2 * MB, "r-xp", LIB))) is None
    gap = maps((base, base + MB, "r--p", LIB), (base + MB + 4096, base + 4 * MB, "r-xp", LIB))
    assert hugetext.read_only_span(base, gap) is None  # not contiguous: only the first MiB counts
    assert hugetext.read_only_span(base + 100 * MB, text) is None
    anon = "7f0000000000-7f0000400000 r-xp 00000000 00:00 0 "
    assert hugetext.read_only_span(base, anon) is None


def test_huge_kb_reads_the_mapping_that_starts_there():
    smaps = "7f0000000000-7f0000400000 r-xp 00000000 00:00 0\nRss: 4096 kB\nAnonHugePages:   4096 kB\n" \
            "7f0000400000-7f0000500000 r--p 00000000 00:00 0\nAnonHugePages:   0 kB\n"
    assert hugetext.huge_kb(0x7F0000000000, smaps) == 4096
    assert hugetext.huge_kb(0x7F0000400000, smaps) == 0
    assert hugetext.huge_kb(0x7F0000800000, smaps) == 0


def _thp_available() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def _span_in(pid: int, lo: int) -> dict:
    """The fields of process `pid`'s mapping that starts at `lo` (its first line's path among them)."""
    out, inside = {}, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = int(line.split("-")[0], 16) == lo
                if inside:
                    out["line"] = line.strip()
            elif inside:
                key, _, value = line.partition(":")
                out[key] = value.strip()
    return out


@pytest.mark.skipif(not _thp_available(), reason="transparent huge pages are off on this machine")
def test_the_fork_server_and_its_processes_share_the_interpreters_code_on_huge_pages():
    with Sandbox() as sb:
        code = "import json, decimal\ndef f(x):\n    return json.loads(json.dumps([x, str(decimal.Decimal(x))]))\n"
        res = sb.run([(code, ["assert f(2) == [2, '2']", "assert f(3) == [3, '3']"])])
        assert res[0].passed == [True, True]
        assert sb.huge_text_bytes >= 2 * MB and sb.huge_text_bytes % (2 * MB) == 0
        with open(f"/proc/{sb.template_pids[0]}/maps") as f:
            anon_x = [line for line in f if " r-xp 00000000 00:00 0 " in line and "[" not in line]
        assert len(anon_x) == 1, anon_x
        lo, hi = (int(x, 16) for x in anon_x[0].split()[0].split("-"))
        assert hi - lo == sb.huge_text_bytes
        for pid in (sb.fork_server_pid, *sb.template_pids):
            assert _span_in(pid, lo)["AnonHugePages"] == f"{(hi - lo) >> 10} kB"
        # the same bytes as the library file holds at those addresses in this process (same build, same offsets)
        here = ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p).value
        with open("/proc/self/maps") as f:
            mine = hugetext.read_only_span(here, f.read())
        if mine is not None and mine[1] - mine[0] == hi - lo:
            fd = os.open(f"/proc/{sb.template_pids[0]}/mem", os.O_RDONLY)
            try:
                theirs = os.pread(fd, hi - lo, lo)
            finally:
                os.close(fd)
            assert theirs == ctypes.string_at(mine[0], hi - lo)


def test_it_can_be_turned_off():
    with Sandbox(huge_text=False) as sb:
        assert sb.run([("def f():\n    return 1\n", ["assert f() == 1"])])[0].passed == [True]
        assert sb.huge_text_bytes == 0
        with open(f"/proc/{sb.template_pids[0]}/maps") as f:
            assert not [line for line in f if " r-xp 00000000 00:00 0 " in line and "[" not in line]
