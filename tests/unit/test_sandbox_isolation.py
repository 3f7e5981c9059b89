"""The judge trusts no type a program names, and one program never changes another program's verdict (the code
sandbox, docs/code.md "Isolation per program"). Each attack runs beside honest programs (the same batch and the
next) that must keep their verdicts; where a route exists in native code the program takes it through ctypes.

The oracles are verdicts of honest programs and of wrong programs that an attack would make pass, and what a
later program finds; never what an attacking program says about itself."""

from __future__ import annotations

import json
import os
import socket
import textwrap

import pytest

from grpo_plugin.sandbox import AssertSuite, CallSuite, Limits, Sandbox, StdioSuite, codec, forkserver_plan, judge_link

pytestmark = pytest.mark.timeout(180)

ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5"]


def honest() -> list:
    return [AssertSuite(ADD, TESTS), CallSuite(ADD, "add", [([1, 2], 3), ([2, 2], 4)]),
            StdioSuite("a, b = map(int, input().split())\nprint(a + b)\n", [("1 2\n", "3"), ("2 2\n", "4")])]


def wrong() -> list:
    """Wrong programs: each must score below 1.0 whatever ran before it."""
    return [AssertSuite(WRONG_ADD, TESTS), CallSuite(WRONG_ADD, "add", [([1, 2], 3), ([2, 2], 4)])]


def run_checked(sb: Sandbox, suites: list) -> list:
    """The suites with honest and wrong programs around them, in this batch and the next one."""
    res = sb.run_suites(honest() + list(suites) + wrong(), dedupe=False)
    later = sb.run_suites(honest() + wrong(), dedupe=False)
    for batch in (res, later):
        good, bad = batch[:3], batch[-2:]
        assert [r.score for r in good] == [1.0] * 3, [r.detail for r in good]
        assert all(r.score < 1.0 for r in bad), [r.detail for r in bad]
    return res[3:3 + len(suites)]


@pytest.fixture(scope="module")
def sb():
    with Sandbox(Limits(wall_s=3), workers=2) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def sb1():
    """One scratch slot and one judge: every job of every batch goes through the same slot and judge."""
    with Sandbox(Limits(wall_s=3), workers=1) as sandbox:
        yield sandbox


# ---- the judge rebuilds values, never behaviour --------------------------------------------------------------
GRAB_SERVICE = """
import gc
def service():
    return [o for o in gc.get_objects() if type(o).__name__ == "Service" and hasattr(o, "encoder")][0]
"""


def test_a_class_named_after_a_library_type_stays_the_programs(sb):
    """An exception class whose module and name are unittest.mock's _ANY (which equals everything): the judge
    once rebuilt it as the real one and every == test passed."""
    code = textwrap.dedent("""
        class _ANY(Exception):
            pass
        _ANY.__module__ = "unittest.mock"
        def add(a, b):
            return _ANY()
        """)
    [res] = run_checked(sb, [AssertSuite(code, TESTS)])
    assert res.passed == [False] * 3, res.detail


def test_a_forged_description_builds_nothing_in_the_judge(sb):
    """The program owns its process: it rewrites what its replies say. A namedtuple tag naming a library class
    (unittest.mock._ANY, types.FunctionType) or a class described as the real one is refused or stays a stand-in."""
    forged = GRAB_SERVICE + textwrap.dedent("""
        s = service()
        real_tree = s.encoder.tree
        def tree(value):
            if value == [0, [0, 0]]:  # the reply to add(...): [return value, arguments after]
                return ["L", ["NT", {"h": 9000, "n": "_ANY", "q": "_ANY", "m": "unittest.mock", "e": True,
                                     "nt": None}], ["L", 0, 0]]
            return real_tree(value)
        s.encoder.tree = tree
        def add(a, b):
            return 0
        """)
    described = GRAB_SERVICE + textwrap.dedent("""
        s = service()
        real_describe = s.describe
        def describe(cls):
            d = dict(real_describe(cls))
            if cls is Eq:
                d.update(m="unittest.mock", q="_ANY", n="_ANY", e=True)
            return d
        s.describe = s.encoder.describe = describe
        class Eq:
            pass
        def add(a, b):
            return Eq()
        """)
    res = run_checked(sb, [AssertSuite(forged, TESTS), AssertSuite(described, TESTS)])
    assert [r.passed for r in res] == [[False] * 3] * 2, [r.detail for r in res]


def test_the_decoder_builds_only_namedtuples_and_builtin_exceptions():
    a, b = socket.socketpair()
    try:
        program = judge_link.Program(a.fileno(), 1 << 20, 1 << 20)
        for desc in ({"h": 1, "n": "FunctionType", "q": "FunctionType", "m": "types", "e": True},
                     {"h": 2, "n": "_ANY", "q": "_ANY", "m": "unittest.mock", "e": True},
                     {"h": 3, "n": "CodeType", "q": "CodeType", "m": "types", "e": False}):
            cls = program.stand_ins.klass(desc)
            assert issubclass(cls, judge_link.Kept), desc  # a stand-in, whatever the description says
        key_error = {"h": 4, "n": "KeyError", "q": "KeyError", "m": "builtins", "e": True}
        assert program.stand_ins.klass(key_error) is KeyError
        with pytest.raises(ValueError):
            program.value(["NT", {"h": 5, "n": "FunctionType", "q": "FunctionType", "m": "types", "e": True}, 1])
        assert program.value(["NT", {"h": 6, "n": "P", "nt": ["x", "y"]}, 1, 2]) == (1, 2)
        assert program.value(["bt", "int"]) is int
        with pytest.raises(ValueError):
            program.value(["bt", "FunctionType"])
    finally:
        a.close()
        b.close()


def test_a_judge_patched_by_one_job_judges_the_next_job_afresh(sb1):
    """A job whose test rewrites the judge's own code (as a judge compromised by one program would be): its
    process ends with the job, and the next jobs on the same judge are judged by the judge's own code."""
    patch = textwrap.dedent("""
        import sys
        j = sys.modules.get("judge") or sys.modules["grpo_plugin.sandbox.judge"]
        j.Judge.assert_test = lambda self, compiled: (True, "passed")
        j.returns_match = lambda got, expected: True
        assert False
        """)
    first = sb1.run_suites([AssertSuite(ADD, [patch, "assert add(1, 1) == 5"])])
    assert first[0].passed == [False, True]  # the patch holds for the rest of ITS job (a test is trusted code)
    later = sb1.run_suites(wrong() + honest(), dedupe=False)
    assert [r.score < 1.0 for r in later[:2]] == [True, True], [r.detail for r in later]
    assert [r.score for r in later[2:]] == [1.0] * 3


def test_what_a_program_forges_for_a_judge_in_place_is_judged_out_of_place_or_fails(sb1):
    """A judge takes a job in its own process only while the program's replies are plain data and the test calls a
    plain function (judge.serve). Programs that rewrite their replies to look plain: a function described with
    special methods of its own, a call's value forged as a function (which, as the program's object, compares by
    its state), a reply with an unknown tag, a describe that claims its class is `function`. Each is judged out of
    place or fails; on the one judge of `sb1`, honest and wrong programs around them, and the next batch, keep
    their verdicts."""
    fn_desc = '{"h": 7000, "n": "function", "q": "function", "m": "builtins", "e": False, "nt": None, "b": []}'
    special = GRAB_SERVICE + textwrap.dedent("""
        s = service()
        real_describe = s.describe
        def describe(cls):
            d = dict(real_describe(cls))
            if "n" in d and d["n"] == "function":
                d["o"] = ["__eq__", "__bool__"]
            return d
        s.describe = s.encoder.describe = describe
        def add(a, b):
            return 0
        """)
    as_function = GRAB_SERVICE + textwrap.dedent(f"""
        s = service()
        real_tree = s.encoder.tree
        def tree(value):
            if isinstance(value, list) and len(value) == 2 and value[0] == 0:  # the reply to add(...)
                return ["L", ["O", 0, {fn_desc}], ["L", 0, 0]]
            return real_tree(value)
        s.encoder.tree = tree
        def add(a, b):
            return 0
        """)
    unknown = GRAB_SERVICE + textwrap.dedent("""
        s = service()
        real_tree = s.encoder.tree
        s.encoder.tree = lambda value: ["L", ["ZZ", 3], ["L", 0, 0]] if value == [0, [0, 0]] else real_tree(value)
        def add(a, b):
            return 0
        """)
    claims = GRAB_SERVICE + textwrap.dedent("""
        s = service()
        real_describe = s.describe
        def describe(cls):
            d = dict(real_describe(cls))
            if cls is Eq:
                d.update(n="function", q="function", m="builtins", e=False, nt=None, b=[])
            return d
        s.describe = s.encoder.describe = describe
        class Eq:
            def __eq__(self, other):
                return True
        def add(a, b):
            return Eq()
        """)
    res = run_checked(sb1, [AssertSuite(code, TESTS) for code in (special, as_function, unknown, claims)])
    assert [r.passed for r in res] == [[False] * 3] * 4, [r.detail for r in res]


def test_what_a_test_prints_never_reaches_the_verdicts(sb):
    """The value printed is the program's: verdict lines in it are text, and a long print is no flood."""
    forger = "def add(a, b):\n    return ''.join(f'P {i}\\nS {i + 1}\\n' for i in range(3)) * 3000\n"
    tests = ["print(add(1, 2)); assert add(1, 2) == 3", "print(add(1, 2)); assert add(2, 2) == 4"]
    long_print = ADD + "def big():\n    return 'x' * (1 << 20)\n"
    res = run_checked(sb, [AssertSuite(forger, tests),
                           AssertSuite(long_print, ["print(big()); assert add(1, 2) == 3"])])
    assert res[0].passed == [False, False], res[0].detail
    assert res[1].passed == [True], res[1].detail


def test_an_import_written_in_a_string_is_no_import(sb):
    """A docstring line `from math import factorial` once made the test's `factorial` the real one."""
    code = '"""Uses\nfrom math import factorial\n"""\ndef factorial(n):\n    return n\n'
    honest_import = "from math import factorial\n"
    nested = "try:\n    from math import gcd\nexcept ImportError:\n    gcd = None\n"
    res = run_checked(sb, [AssertSuite(code, ["assert factorial(5) == 120"]),
                           AssertSuite(honest_import, ["assert factorial(5) == 120"]),
                           AssertSuite(nested, ["assert gcd(4, 6) == 2"])])
    assert [r.passed for r in res] == [[False], [True], [True]], [r.detail for r in res]
    assert forkserver_plan.program_imports(code) == {}
    assert forkserver_plan.program_imports(nested) == {"gcd": ("math", "gcd")}


# ---- one program never changes another's verdict --------------------------------------------------------------
WRITES = AssertSuite("open('f.txt', 'w').write('ok')\nok = open('f.txt').read()\nimport os\nmine = os.listdir('.')\n",
                     ["assert ok == 'ok'", "assert mine == ['f.txt']"])


def test_a_poisoned_scratch_directory_is_gone_for_the_next_program(sb1):
    poison = StdioSuite(textwrap.dedent("""
        import os, ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        open('left.txt', 'w').write('x')
        try:
            os.setxattr('.', 'user.mark', b'1')
        except OSError:
            pass
        os.utime('.', (0, 0))
        libc.chmod(b'.', 0)
        print('done')
        """), [("", "done")])
    after = AssertSuite("import os\nmtime, mode = os.stat('.').st_mtime, os.stat('.').st_mode\n"
                        "xattrs = os.listxattr('.')\n",
                        ["assert mtime > 1e9", "assert xattrs == []", "assert oct(mode & 0o777) == '0o700'"])
    assert sb1.run_suites([poison])[0].passed == [True]
    res = sb1.run_suites([WRITES, after])
    assert [r.passed for r in res] == [[True, True], [True, True, True]], [r.detail for r in res]


def test_a_program_cannot_find_or_touch_its_siblings_directories(sb):
    probe = StdioSuite(textwrap.dedent("""
        import os
        out = []
        for d in ('..', '/grpo/scratch'):
            try:
                os.listdir(d)
                out.append('listed ' + d)
            except PermissionError:
                pass
        print(' '.join(out) or 'none')
        """), [("", "none")])
    [res] = run_checked(sb, [probe])
    assert res.passed == [True], res.detail


def test_one_program_filling_its_scratch_leaves_the_others_theirs(sb):
    """A program writes until its file system is full and holds it; a sibling started after it writes a file."""
    filler = StdioSuite(textwrap.dedent("""
        import time
        k = 0
        try:
            while True:
                with open(f'f{k}', 'wb') as f:
                    f.write(b'x' * (1 << 20))
                k += 1
        except OSError:
            pass
        time.sleep(1.5)
        print('full', k > 0)
        """), [("", "full True")])
    writer = AssertSuite("import time\ntime.sleep(0.5)\nopen('w.bin', 'wb').write(b'y' * 500000)\n"
                         "ok = len(open('w.bin', 'rb').read())\n", ["assert ok == 500000"])
    res = sb.run_suites([filler, writer], dedupe=False)
    assert [r.passed for r in res] == [[True], [True]], [r.detail for r in res]


def test_a_thread_bomb_leaves_siblings_their_threads(sb):
    bomb = StdioSuite(textwrap.dedent("""
        import threading, time
        stop = threading.Event()
        n = 0
        try:
            while True:
                threading.Thread(target=stop.wait, daemon=True).start()
                n += 1
        except RuntimeError:
            pass
        time.sleep(1.5)
        stop.set()
        print('bomb', n > 10)
        """), [("", "bomb True")])
    sibling = AssertSuite("import threading, time\ntime.sleep(0.5)\nout = []\n"
                          "t = threading.Thread(target=out.append, args=(1,))\nt.start()\nt.join()\n",
                          ["assert out == [1]"])
    res = sb.run_suites([bomb, sibling], dedupe=False)
    assert [r.passed for r in res] == [[True], [True]], [r.detail for r in res]


def test_renice_of_its_process_group_reaches_only_itself(sb1):
    renice = StdioSuite(textwrap.dedent("""
        import os, ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setpriority(1, 0, 19)   # PRIO_PGRP, its own group
        os.setpriority(os.PRIO_PGRP, 0, 19)
        print(os.getpgrp() == os.getpid(), os.getpriority(os.PRIO_PROCESS, 0))
        """), [("", "True 19")])
    later = AssertSuite("import os\nnice = os.getpriority(os.PRIO_PROCESS, 0)\n", ["assert nice == 0"])
    assert sb1.run_suites([renice])[0].passed == [True]
    assert sb1.run_suites([later])[0].passed == [True]


def test_no_network_no_netlink_no_exec_no_memfd_no_wider_affinity(sb):
    probe = StdioSuite(textwrap.dedent("""
        import os, socket, ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        NR = {"x86_64": {"socket": 41, "memfd_create": 319, "sched_setaffinity": 203},
              "aarch64": {"socket": 198, "memfd_create": 279, "sched_setaffinity": 122}}[os.uname().machine]
        got = []
        for what, call in [
                ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))),
                ("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)),
                ("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
                ("memfd", lambda: os.memfd_create("x")),
                ("exec", lambda: os.execv("/usr/bin/true", ["true"])),
                ("affinity", lambda: os.sched_setaffinity(0, range(os.cpu_count())))]:
            try:
                call()
                got.append(what)
            except OSError:
                pass
        mask = ctypes.c_ulong(-1)
        for what, rc in [("raw socket", libc.syscall(NR["socket"], 2, 2, 0)),
                         ("raw memfd", libc.syscall(NR["memfd_create"], b"x", 0)),
                         ("raw affinity", libc.syscall(NR["sched_setaffinity"], 0, 8, ctypes.byref(mask)))]:
            if rc >= 0:
                got.append(what)
        a, b = socket.socketpair()  # Unix sockets stay (asyncio, multiprocessing)
        a.send(b"u")
        print(" ".join(got) or "none", b.recv(1).decode())
        """), [("", "none u")])
    [res] = run_checked(sb, [probe])
    assert res.passed == [True], res.detail


def test_the_machines_device_nodes_and_other_processes_are_out_of_reach(sb):
    probe = StdioSuite(textwrap.dedent("""
        import os
        got = []
        try:
            os.utime("/dev/null", (0, 0))
            got.append("utime /dev/null")
        except OSError:
            pass
        open("/dev/null", "w").write("still a device")
        seen = [n for n in range(1, 4096) if os.path.exists(f"/proc/{n}")]
        if len(seen) > 1:  # its own process only
            got.append(f"{len(seen)} processes")
        print(" ".join(got) or "none")
        """), [("", "none")])
    sleeper = AssertSuite("import time\ntime.sleep(0.5)\n", ["assert True"])
    res = run_checked(sb, [sleeper, probe])
    assert [r.passed for r in res] == [[True], [True]], [r.detail for r in res]


# ---- the trainer's memory -----------------------------------------------------------------------------------------
def test_outputs_are_judged_as_they_arrive(sb):
    """The trainer keeps a verdict per program, not what it printed: each reply is judged when it comes in."""
    big = StdioSuite("print('z' * 300000)\n", [("", "no")] * 3)
    held = []  # bytes of replies still alive when each reply is judged
    real = sb._exchange

    def spy(jobs, judge_, *outputs):  # (outputs: each test's stdout, compared as it arrives, never in a reply)
        alive: list = []

        def judge_and_watch(k, reply):
            alive.append(reply)
            held.append(sum(len(json.dumps(r)) for r in alive if r is not None))
            judge_(k, reply)
            alive[-1] = None  # the reply is the exchange's to drop now

        return real(jobs, judge_and_watch, *outputs)

    sb._exchange = spy
    try:
        res = sb.run_suites([big] * 4, dedupe=False)
    finally:
        del sb._exchange
    assert [r.passed for r in res] == [[False] * 3] * 4
    assert len(held) == 4 and max(held) < 1_000_000 < 4 * 900_000  # one job's output at a time, not the batch's
    assert len(json.dumps([[r.passed, r.detail, r.output] for r in res])) < 20000


def test_dict_views_and_builtin_types_travel_as_values():
    enc = codec.Encoder(lambda obj: 0, lambda cls: {"h": 1})
    dec = codec.Decoder(lambda h, d: None, lambda d: None, 1 << 20)
    d = {"b": 1, "a": [2]}
    for value in (d.keys(), d.values(), d.items(), {}.keys(), [int, str, dict]):
        got = dec.value(enc.tree(value))
        if isinstance(value, list):
            assert got == value and all(g is v for g, v in zip(got, value))
        else:
            assert type(got) is type(value) and list(got) == list(value) and bool(got) == bool(value)


def test_a_programs_dev_shm_is_its_own_and_mounts_stay_refused(sb):
    """A program that uses multiprocessing gets its scratch directory as its /dev/shm (its own mount namespace, made
    before it is confined): a sibling sees nothing of it, and neither can make a mount or a namespace itself."""
    pool = StdioSuite(textwrap.dedent("""
        import multiprocessing, os, time
        with multiprocessing.Pool(2) as p:
            print(sum(p.map(abs, [-1, -2, 3])))
        open('/dev/shm/mark', 'w').write('x')
        print(os.path.exists('mark'))
        time.sleep(1)
        """), [("", "6 True")])
    probe = StdioSuite(textwrap.dedent("""
        import os, ctypes, time
        libc = ctypes.CDLL(None, use_errno=True)
        time.sleep(0.4)
        got = []
        try:
            got.append(os.listdir('/dev/shm'))
        except OSError:
            pass
        if libc.unshare(0x00020000) == 0:
            got.append('unshare')
        if libc.mount(b'.', b'/dev/shm', None, 4096, None) == 0:
            got.append('mount')
        try:
            open('/dev/shm/x', 'w')
            got.append('wrote /dev/shm')
        except OSError:
            pass
        print(got or 'none')
        """), [("", "none")])
    res = run_checked(sb, [pool, probe])
    assert [r.passed for r in res] == [[True], [True]], [r.detail for r in res]


def test_callbacks_give_the_program_nothing_but_the_tests_own_functions(sb):
    """Red team of the callbacks (a test's function the program calls back): the program asks for callbacks it was
    never given, asks them with values that would need behaviour to rebuild, recurses through them without end, and
    keeps one to call from a later test. Each fails only its own tests."""
    forger = GRAB_SERVICE + textwrap.dedent("""
        s = service()
        def apply(f, xs):
            s.callback(7, "call", [], {})  # a callback that was never passed
            return [f(x) for x in xs]
        """)
    recursive = textwrap.dedent("""
        def apply(f, xs):
            return [f(lambda: apply(f, xs)) for x in xs]
        """)
    kept = textwrap.dedent("""
        saved = []
        def apply(f, xs):
            saved.append(f)
            return [saved[0](x) for x in xs]
        """)
    tests = ["assert apply(lambda x: x * 2, [1, 2]) == [2, 4]", "assert apply(lambda x: x + 1, [1]) == [3]"]
    res = run_checked(sb, [AssertSuite(forger, tests), AssertSuite(recursive, tests[:1]),
                           AssertSuite(kept, tests)])
    assert res[0].passed == [False, False], res[0].detail
    assert res[1].passed == [False], res[1].detail
    # the kept function is the first test's (x * 2): the second test sees the program's wrong answer, 2, not 3
    assert res[2].passed == [True, False], res[2].detail


def test_what_a_test_forks_and_leaves_does_not_use_up_the_judges(sb1):
    """A test that forks a process and leaves it behind, many jobs in a row on one judge: the orphans end and are
    collected by the judge (PID 1 of its namespace), so the judges' process budget (64) is never used up."""
    leave = "import os\nif os.fork() == 0:\n    os._exit(0)\nassert add(1, 2) == 3"
    res = sb1.run_suites([AssertSuite(ADD, [leave]) for _ in range(80)], dedupe=False)
    assert all(r.passed == [True] for r in res), [r.detail for r in res if r.passed != [True]][:3]


# ---- a memory and process budget per program, across all its processes (sandbox/cgroups.py) -------------------
HOARD = """
import os, time
held = 0
kids = []
for _ in range({n}):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        block = b'x' * ({mb} << 20)  # written: every page is the process's own
        os.write(w, b'1')
        time.sleep(1.5)
        os._exit(0)
    os.close(w)
    kids.append((pid, r))
for pid, r in kids:
    held += len(os.read(r, 1))
    os.waitpid(pid, 0)
print(held)
"""


def _cgroups_expected() -> bool:
    """Root on a machine with a writable cgroup v1 memory hierarchy (this project's CI machine): the sandbox must
    make its cgroups there, never fall back."""
    from grpo_plugin.sandbox import cgroups

    mount = cgroups._mounts().get("memory")
    return os.geteuid() == 0 and mount is not None and os.access(mount, os.W_OK)


@pytest.fixture(scope="module")
def sb_small():
    """Programs may have 256 MiB of address space per process: their slot's cgroup, 256 + 64 MiB in all."""
    with Sandbox(Limits(wall_s=8, memory_mb=256), workers=2) as sandbox:
        yield sandbox


def test_a_programs_processes_share_one_memory_budget(sb_small):
    """Six processes of 150 MiB each: every one within its own address-space limit, 900 MiB together. The slot's
    memory cgroup stops them (the kernel's OOM killer, inside the cgroup), the machine never holds them; two of
    100 MiB fit; the honest sibling beside the hoarder keeps its verdict."""
    if sb_small.slot_cgroups is None:
        assert not _cgroups_expected(), sb_small.cgroups_missing
        pytest.skip(f"the kernel lets this process make no cgroups: {sb_small.cgroups_missing}")
    assert "cgroup per slot" in sb_small.isolation
    hoard = StdioSuite(HOARD.format(n=6, mb=150), [("", "6")])
    fits = StdioSuite(HOARD.format(n=2, mb=100), [("", "2")])
    res = sb_small.run_suites([hoard, AssertSuite(ADD, TESTS)], dedupe=False)
    assert res[0].passed == [False], res[0].detail
    assert res[1].passed == [True] * 3, res[1].detail
    limit = (256 + 64) << 20
    peaks = [sb_small.slot_cgroups.peak_bytes(k) for k in range(2)]
    assert max(peaks) > 100 << 20 and all(p <= limit for p in peaks), peaks  # charged there, never past it
    assert sb_small.run_suites([fits])[0].passed == [True]


def test_the_slots_cgroups_are_removed_with_the_sandbox():
    with Sandbox(Limits(wall_s=3), workers=2) as sandbox:
        made = sandbox.slot_cgroups
        if made is None:
            assert not _cgroups_expected(), sandbox.cgroups_missing
            pytest.skip(f"the kernel lets this process make no cgroups: {sandbox.cgroups_missing}")
        dirs = list(made.dirs.values())
        assert all((d / "slot-1").is_dir() for d in dirs)
        pids = made.dirs.get("pids", made.dirs.get("unified"))
        assert (pids / "slot-1" / "pids.max").read_text().strip() == str(Limits().processes)
        assert sandbox.run([(ADD, TESTS)])[0].score == 1.0
    assert not any(d.exists() for d in dirs), dirs
