"""The code sandbox (grpo_plugin.sandbox) on real programs: each attack class a policy learns against a weak reward,
each limit, and HumanEval. Every attack test also runs the NAIVE runner (a fresh `python` per test case, no
isolation, pass = exit status 0 and the harness's "PASSED" line) to show the attack is real: it fools that one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from grpo_plugin.sandbox import Limits, Sandbox


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(Limits(wall_s=1.0, memory_mb=512)) as sb:
        yield sb


def naive_passes(code: str, test: str, timeout: float = 10) -> bool:
    """How many code rewards run tests: the program and one test in a fresh interpreter, judged by exit status
    and what it printed."""
    script = f"{code}\n{test}\nprint('PASSED')\n"
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and "PASSED" in out.stdout


def left_in_scratch(sandbox) -> list[str]:
    """What programs left in the fork server's scratch slots (one per program running at once; each holds the
    fresh, empty directory of its next program and nothing else)."""
    root = f"/proc/{sandbox.fork_server_pid}/root/grpo/scratch"  # the jail's tmpfs, seen through the fork server
    left = []
    for slot in os.listdir(root):
        dirs = os.listdir(os.path.join(root, slot))
        left += [f"{slot}: {len(dirs)} directories"] if len(dirs) != 1 else []
        left += [f"{slot}/{d}/{f}" for d in dirs for f in os.listdir(os.path.join(root, slot, d))]
    return left


def one(sandbox, code: str, tests: list[str]):
    return sandbox.run([(textwrap.dedent(code), tests)])[0]


WRONG = "def add(a, b):\n    return a - b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]

ATTACKS = {
    "prints PASSED, exit(0) before the tests": "import sys\nprint('PASSED')\nsys.exit(0)\n" + WRONG,
    "os._exit(0) before the tests": "import os\nprint('PASSED', flush=True)\nos._exit(0)\n" + WRONG,
    "atexit exits 0": WRONG + "import atexit, os\n"
                              "atexit.register(lambda: (print('PASSED', flush=True), os._exit(0)))\n",
    "fake equality": "class Yes(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
                     "def add(a, b):\n    return Yes(0)\n",
    "replaced builtins": WRONG + "import builtins\nbuiltins.AssertionError = KeyboardInterrupt\n"
                                 "builtins.exec = lambda *a, **k: None\n",
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_reward_hacks_fool_the_naive_runner_but_not_the_sandbox(sandbox, name):
    code = ATTACKS[name]
    if name != "replaced builtins":  # that one fools nothing: shown for the sandbox's own harness
        assert all(naive_passes(code, t) for t in TESTS), f"{name}: the naive runner was not fooled"
    res = one(sandbox, code, TESTS)
    assert res.passed == [False, False], (name, res)


def test_correct_code_passes_and_each_test_is_judged_on_its_own(sandbox):
    res = one(sandbox, "def add(a, b):\n    if a == 2:\n        raise ValueError\n    return a + b\n",
              TESTS + ["assert add(5, 5) == 10", "assert add(0, 0) == 1"])
    assert res.passed == [True, False, True, False] and res.score == 0.5
    assert res.detail[1] == "ValueError" and res.detail[3] == "AssertionError"


def test_programs_compile_as_python_runs_them(sandbox):
    """Compiled in the fork server, programs and tests get none of its `from __future__` flags: an annotation that
    names what the program never imported raises NameError, as in `python solution.py` (with the server's
    `annotations` flag it was never evaluated, and the program passed)."""
    missing = "def first(xs: List[int]) -> int:\n    return xs[0]\n"
    imported = "from typing import List\n" + missing
    res = sandbox.run([(missing, ["assert first([3]) == 3"]), (imported, ["assert first([3]) == 3"])])
    assert [r.passed for r in res] == [[False], [True]], res
    assert "NameError" in res[0].detail[0]


def test_a_test_that_kills_its_process_fails_alone(sandbox):
    code = "import os\ndef add(a, b):\n    if a == 2:\n        os._exit(0)\n    return a + b\n"
    res = one(sandbox, code, TESTS + ["assert add(3, 4) == 7"])
    assert res.passed == [True, False, True]  # the rest ran in a fresh child


def test_crashing_the_interpreter_breaks_nothing_else(sandbox):
    crash = "import sys\nsys.setrecursionlimit(10**8)\ndef add(a, b):\n    return add(a, b)\n"
    good = "def add(a, b):\n    return a + b\n"
    res = sandbox.run([(crash, TESTS), (good, TESTS)])
    assert res[0].passed == [False, False] and res[1].passed == [True, True]


def test_time_limit(sandbox):
    t0 = time.monotonic()
    res = one(sandbox, "def add(a, b):\n    while True:\n        pass\n",
              ["assert add(1, 2) == 3", "assert 1 + 1 == 2"])
    assert res.passed == [False, True] and "timed out" in res.detail[0]
    assert time.monotonic() - t0 < 10
    res = one(sandbox, "import time\ntime.sleep(30)\n", ["assert True"])  # wall clock, not only CPU time
    assert res.passed == [False] and "timed out" in res.detail[0]


def test_a_limit_counts_what_the_program_did_not_how_busy_the_machine_is(sandbox):
    """Programs that each need ~0.4 s of CPU against a 1 s limit, three or more to a core at once: each waits for
    its core longer than it runs, and each passes (the time it waited is added to its deadline); one that sleeps
    past its limit or loops forever alongside them still times out."""
    busy = ("import time\ndef work(k):\n    t = time.process_time()\n"
            "    while time.process_time() - t < 0.4:\n        pass\n    return k\n")
    batch = [(busy + f"# {k}\n", [f"assert work({k}) == {k}"]) for k in range(3 * sandbox.workers)]
    batch += [("import time\ndef nap():\n    time.sleep(1.5)\n", ["nap()"]),
              ("def spin():\n    while True:\n        pass\n", ["spin()"])]
    t0 = time.monotonic()
    res = sandbox.run(batch)
    assert [r.passed for r in res[:-2]] == [[True]] * (len(batch) - 2), [r.detail for r in res if not r.passed[0]]
    assert res[-2].passed == [False] and res[-2].detail[0].startswith("timed out after 1 s"), res[-2]
    assert res[-1].passed == [False] and "timed out after 1 s" in res[-1].detail[0], res[-1]
    assert time.monotonic() - t0 < 30


def test_a_program_alone_earns_no_time_by_competing_with_itself(sandbox):
    """Needs 0.6 s of CPU against a 1 s limit, with a busy process of its own on its core: it waits for the core
    about half the time, which is its own doing, so it is stopped at the limit with no time added (credited, that
    wait let it pass). Alone on its core, whatever else runs on the machine, nothing is added."""
    code = ("import os, time\nif os.fork() == 0:\n    while True:\n        pass\n"
            "def work():\n    t = time.process_time()\n    while time.process_time() - t < 0.6:\n        pass\n"
            "    return 1\n")
    res = one(sandbox, code, ["assert work() == 1"])
    assert res.passed == [False] and res.detail[0] == "timed out after 1 s", res


def test_memory_limit(sandbox):
    res = one(sandbox, "x = bytearray(1024 * 1024 * 1024)\n", ["assert len(x) > 0"])  # 1 GiB > the 512 MiB limit
    assert res.passed == [False] and "MemoryError" in res.detail[0]


def test_no_processes_and_none_left_behind(sandbox):
    """A program may fork inside its own PID namespace (nothing executable: exec is refused by the kernel); when it
    ends, the kernel ends everything it started: no process of the programs' user outlives its run."""
    attempts = [
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\n",
        "import subprocess\nsubprocess.Popen(['sleep', '100'], start_new_session=True)\n",
        "import os\nassert os.system('sleep 100 &') == 0\n",
        "import multiprocessing, time\np = multiprocessing.Process(target=time.sleep, args=(30,))\np.start()\n",
    ]
    results = sandbox.run([(code, ["assert True"]) for code in attempts])
    assert results[1].passed == [False] and results[2].passed == [False], results  # nothing may be executed
    time.sleep(0.5)
    left = [p for p in psutil.Process(sandbox.jail_pid).children(recursive=True) if p.uids().real == 65534]
    assert left == [], left


def test_cannot_signal_its_parents(sandbox):
    """Its parent is outside its PID namespace: getppid() is 0, and no pid names the fork server."""
    res = one(sandbox, "import os, signal\nppid = os.getppid()\nos.kill(ppid, signal.SIGKILL)\n", ["assert ppid == 0"])
    assert res.passed == [True], res
    assert psutil.pid_exists(sandbox.template_pid) and psutil.pid_exists(sandbox.fork_server_pid)
    assert one(sandbox, "x = 1\n", ["assert x == 1"]).passed == [True]  # the fork server still serves


def test_files_only_in_a_private_scratch_directory(sandbox, tmp_path):
    outside = tmp_path / "owned.txt"
    res = one(sandbox, f"open({str(outside)!r}, 'w').write('x')\n", ["assert True"])
    assert res.passed == [False] and not outside.exists()
    res = one(sandbox, "open('/etc/hostname').read()\n", ["assert True"])
    assert res.passed == [False]
    inside = "import os\nopen('notes.txt', 'w').write('ok')\nnotes = open('notes.txt').read()\n"
    res = one(sandbox, inside, ["assert notes == 'ok'"])  # the test runs in the judge: it reads the program's value
    assert res.passed == [True]
    assert left_in_scratch(sandbox) == []  # every scratch directory was emptied


def test_no_network(sandbox):
    attempts = ["import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n",
                "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:1', timeout=1)\n"]
    assert all(r.passed == [False] for r in sandbox.run([(c, ["assert True"]) for c in attempts]))


def test_an_empty_environment_and_no_way_to_the_trainers(monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", "hunter2")
    with Sandbox(Limits(wall_s=1.0)) as sb:  # started with the secret in this process's environment
        res = sb.run([
            ("import os\nenv = dict(os.environ)\n", ["assert 'GRPO_TEST_SECRET' not in env and 'HOME' in env"]),
            (f"data = open('/proc/{os.getpid()}/environ', 'rb').read()\n", ["assert b'hunter2' in data"]),
            ("data = open('/proc/self/environ', 'rb').read()\n", ["assert True"]),
        ])
    assert [r.passed for r in res] == [[True], [False], [False]]


def test_scratch_directories_are_reused_never_shared(sandbox):
    """A program's scratch directory is emptied before the next program runs there, whatever it left: files,
    directories, permissions taken away."""
    leave = ("import os\nopen('left.txt', 'w').write('x')\nos.mkdir('sub')\nopen('sub/f', 'w').write('y')\n"
             "os.chmod('sub', 0)\n")
    assert sandbox.run([(leave, ["assert True"])] * sandbox.workers)[0].passed == [True]
    look = "import os\nseen = sorted(os.listdir('.'))\n"
    res = sandbox.run([(look + f"# program {k}\n", ["assert seen == []"]) for k in range(2 * sandbox.workers)])
    assert [r.passed for r in res] == [[True]] * (2 * sandbox.workers), res
    assert left_in_scratch(sandbox) == []


def test_humaneval_canonical_solutions_score_one():
    from grpo_plugin.codedata.humaneval import rows
    from rewards.code import extract_code

    problems = rows()
    assert len(problems) >= 140
    with Sandbox() as sb:
        res = sb.run([(extract_code(p["response"]), p["test_cases"]) for p in problems])
    failed = [(p["task_id"], r.detail) for p, r in zip(problems, res) if r.score != 1.0]
    assert not failed, failed[:5]


def test_broken_humaneval_solutions_score_what_a_trusted_runner_says():
    """Canonical solutions with one line broken: the sandbox's per-test verdicts equal those of a trusted
    one-process-per-test run (the code is not adversarial here, so the naive runner is the reference)."""
    from grpo_plugin.codedata.humaneval import rows
    from rewards.code import extract_code

    broken = []
    for p in rows()[:20]:
        code = extract_code(p["response"])
        if "return " not in code:
            continue
        head, _, tail = code.rpartition("return ")
        broken.append((head + "return None and " + tail, p["test_cases"]))  # the last return gives None/falsy
    with Sandbox() as sb:
        res = sb.run(broken)
    mismatches = []
    for (code, tests), r in zip(broken, res):
        trusted = [naive_passes(code, t) for t in tests]
        if trusted != r.passed:
            mismatches.append((code[-80:], trusted, r.passed))
    assert not mismatches, mismatches[:3]
    assert any(not all(r.passed) for r in res) and any(any(r.passed) for r in res)


def test_killing_its_parent_breaks_a_naive_harness_but_not_the_sandbox(sandbox):
    """The naive harness is the program's parent; the sandbox's children are the fork server's, and may not signal."""
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG
    harness = ("import subprocess, sys\n"
               f"r = subprocess.run([sys.executable, '-c', {code + TESTS[0]!r}])\n"
               "print('VERDICT', r.returncode == 0)\n")
    naive = subprocess.run([sys.executable, "-c", harness], capture_output=True, text=True, timeout=60)
    assert naive.returncode == -9 and "VERDICT" not in naive.stdout  # the caller itself was killed
    res = sandbox.run([(code, TESTS), ("def add(a, b):\n    return a + b\n", TESTS)])
    assert res[0].passed == [False, False] and res[1].passed == [True, True]


def test_a_machine_without_isolation_is_refused_with_what_to_do(monkeypatch, tmp_path):
    """Fault injected: a fork server that reports it could not create a network namespace."""
    import grpo_plugin.sandbox.client as client
    from grpo_plugin.sandbox import SandboxUnavailable

    stub = tmp_path / "forkserver.py"
    stub.write_text("import json\nprint(json.dumps({'error': 'no network isolation: unshare failed (EPERM)'}))\n")
    monkeypatch.setattr(client, "FORK_SERVER", stub)
    with pytest.raises(SandboxUnavailable, match=r"unshare failed \(EPERM\).*unprivileged_userns_clone"):
        Sandbox()


# ---- attacks found against the in-process harness (issue 28): each must fail where it was a pass ----------------
HARNESS_ATTACKS = {  # name: (wrong program that attacks, its tests, a correct program the tests pass)
    # the program rebinds the builtins and module functions a test calls at run time
    "rebound abs": ("def add(a, b):\n    return a - b\nimport builtins\nbuiltins.abs = lambda x: 0\n",
                    ["assert abs(add(1, 2) - 3) < 1e-9"], "def add(a, b):\n    return a + b\n"),
    "rebound len/all/type": ("def add(a, b):\n    return [a - b, 0]\nimport builtins\n"
                             "builtins.len = lambda x: 1\nbuiltins.all = lambda x: True\n"
                             "builtins.type = lambda x: list\n",
                             ["assert len(add(1, 2)) == 1", "assert all([add(1, 2) == [3]])",
                              "assert type(add(1, 2)[0]) == int and add(1, 2)[0] == 3"],
                             "def add(a, b):\n    return [a + b]\n"),
    "monkeypatched math.isclose": ("import math\nmath.isclose = lambda *a, **k: True\n"
                                   "def add(a, b):\n    return a - b\n",
                                   ["import math\nassert math.isclose(add(1, 2), 3)",
                                    "assert math.isclose(add(1, 2), 3)"],  # `math` from the program's import
                                   "import math\ndef add(a, b):\n    return a + b\n"),
    # objects that lie to <, >, in and to comparisons with computed expected values
    "lying order and membership": ("class Liar(int):\n"
                                   "    def __lt__(s, o): return True\n    def __gt__(s, o): return True\n"
                                   "    def __eq__(s, o): return True\n    def __contains__(s, o): return True\n"
                                   "    __hash__ = int.__hash__\n"
                                   "def add(a, b):\n    return Liar(0)\n",
                                   ["assert 2 < add(1, 2) < 4", "assert add(2, 3) == 2 + 3",
                                    "assert add(10**9, 0) == 10**9", "assert add(1, 2) in [3]"],
                                   "def add(a, b):\n    return a + b\n"),
    "lying list": ("class L(list):\n    def __eq__(s, o): return True\n    __hash__ = None\n"
                   "def add(a, b):\n    return L()\n", ["assert add(1, 2) == [1, 2] * 2"],
                   "def add(a, b):\n    return [a, b] * 2\n"),
}


@pytest.mark.parametrize("name", list(HARNESS_ATTACKS))
def test_rebinding_and_lying_objects_cannot_pass_a_test(sandbox, name):
    code, tests, good = HARNESS_ATTACKS[name]
    assert sandbox.run([(code, tests)])[0].passed == [False] * len(tests), name
    assert sandbox.run([(good, tests)])[0].passed == [True] * len(tests), name  # the tests can pass


# a signal handler's frame walks up to the harness (f_back/f_locals raise no audit event in 3.12), reads the nonce
# and the verdict pipe, and forges every line a pass could need: test passed, slot values, an out-of-range test
FRAME_WALK = '''
import os, signal, sys
def add(a, b):
    return a - b
def forge(signum, frame):
    f, found = frame, {}
    while f is not None:
        found.update({k: v for k, v in f.f_locals.items() if k in ("nonce", "w", "i", "start")})
        f = f.f_back
    if "nonce" in found and "w" in found:
        n, w, i = found["nonce"], found["w"], found.get("i", found.get("start", 0))
        for line in (f"{n} P {i}", f"{n} V {i} 0 " + '{"i": "0x3"}', f"{n} T {i}", f"{n} P 99"):
            os.write(w, (line + "\\n").encode())
        print("FORGED", file=sys.stderr, flush=True)
signal.signal(signal.SIGALRM, forge)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
import time
time.sleep(0.05)
'''


def test_a_signal_handler_that_reaches_the_harness_forges_nothing(sandbox):
    res = sandbox.run([(FRAME_WALK, ["assert add(1, 2) == 3"]), ("def add(a, b):\n    return a + b\n", TESTS)])
    assert res[0].passed == [False]
    assert res[1].passed == [True, True]  # another program in the batch is untouched


def test_files_are_confined_by_the_kernel_not_by_path_strings(sandbox, tmp_path):
    """dir_fd-relative opens passed the old path-string checks: Landlock refuses them by what they reach."""
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    probes = {
        "read": f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
                "data = os.read(os.open('secret.txt', os.O_RDONLY, dir_fd=fd), 100)\n",
        "read /etc": "import os\nfd = os.open('/', os.O_RDONLY)\n"
                     "os.read(os.open('etc/passwd', os.O_RDONLY, dir_fd=fd), 9)\n",
        "environ": f"import os\nfd = os.open('/proc', os.O_RDONLY)\n"
                   f"os.read(os.open('{os.getpid()}/environ', os.O_RDONLY, dir_fd=fd), 100)\n",
        "write": f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
                 "os.write(os.open('victim.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=fd), b'owned')\n",
        "delete": f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\nos.unlink('victim.txt', dir_fd=fd)\n",
        "create": f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
                  "os.close(os.open('new.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd))\n",
    }
    # each fails with the kernel's error (the path is not in the jail, or Landlock refuses it), which the program
    # can catch, as on a locked-down machine
    codes = [f"try:\n    exec({code!r})\n    refused = False\nexcept OSError:\n    refused = True\n"
             for code in probes.values()]
    res = sandbox.run([(c, ["assert refused"]) for c in codes])
    assert [r.passed for r in res] == [[True]] * len(probes), dict(zip(probes, res))
    assert victim.read_text() == "keep me" and not (tmp_path / "new.txt").exists()


def test_the_fork_server_survives_what_hung_or_crashed_it(sandbox):
    """A FIFO where its output was read (hung it), a deep tree in the scratch dir (2000 deep crashed the recursive
    cleanup; Limits.files now stops it at 256): every program of the batch still gets its verdicts, and no scratch
    directory is left."""
    fifo = "import os\nos.mkfifo('.out')\n"
    deep = ("import os\nfor _ in range(2000):\n    try:\n        os.mkdir('d')\n    except PermissionError:\n"
            "        break\n    os.chdir('d')\n")  # as deep as it may (Limits.files directories)
    flood = "import os\nos.write(3, b'x' * (64 << 20))\n"  # a line without end on every descriptor it may guess
    good = "def add(a, b):\n    return a + b\n"
    t0 = time.monotonic()
    res = sandbox.run([(fifo, ["assert True"]), (deep, ["assert True"]), (flood, ["assert True"]), (good, TESTS)])
    assert res[0].passed == [False] and res[1].passed == [True] and res[2].passed == [False]
    assert res[3].passed == [True, True]
    assert time.monotonic() - t0 < 20
    assert left_in_scratch(sandbox) == []


def test_ordinary_operations_work_and_the_kernel_refuses_the_rest(sandbox):
    """Imports and ordinary operations work as in plain CPython; what would reach outside fails with the kernel's
    own error, which the program can catch."""
    code = ("import socket, select, resource, multiprocessing, gc, threading, subprocess, ctypes\n"
            "import sys\n"
            "try:\n    resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
            "except (ValueError, PermissionError, OSError):\n    pass\n"
            "sys.setrecursionlimit(10**5)\n"
            "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
            "refused = []\n"
            "for op in (lambda: socket.create_connection(('127.0.0.1', 22), timeout=1),"
            " lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (10**6, 10**6)),"
            " lambda: subprocess.run(['true']), lambda: open('/etc/passwd')):\n"
            "    try:\n        op()\n    except (OSError, ValueError):\n        refused.append(True)\n"
            "t = threading.Thread(target=lambda: None)\nt.start()\nt.join()\nobjs = len(gc.get_objects())\n")
    res = sandbox.run([(code, ["assert depth(3000) == 3000", "assert refused == [True] * 4", "assert objs > 0"])])[0]
    assert res.passed == [True, True, True], res
    low = ("import resource\nsoft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
           "resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 32), min(hard, 32)))\n")
    assert one(sandbox, low, ["assert True"]).passed == [True]


def test_a_program_repeated_in_a_batch_runs_once_and_each_copy_gets_its_verdicts(sandbox):
    rand = "import random\ndef add(a, b):\n    return a + b if random.random() < 0.5 else 0\n"
    good = "def add(a, b):\n    return a + b\n"
    res = sandbox.run([(rand, TESTS)] * 6 + [(good, TESTS), (WRONG, TESTS), (good, TESTS)])
    assert sandbox.last_unique == 3
    assert len({tuple(r.passed) for r in res[:6]}) == 1  # one run, shared: the copies score alike
    assert res[6].passed == res[8].passed == [True, True] and res[7].passed == [False, False]
    from grpo_plugin.sandbox import AssertSuite

    sandbox.run_suites([AssertSuite(good, TESTS)] * 2, dedupe=False)
    assert sandbox.last_unique == 2  # dedupe off: each copy runs


def test_names_the_program_rebinds_during_a_call_are_looked_up_again(sandbox):
    """The program's functions come with its first reply (one round trip fewer per job); once a test has called
    into it, a name not yet used is asked for as it is then."""
    code = ("def g():\n    return 1\n"
            "def rebind():\n    global g\n    def g():\n        return 2\n    return 0\n")
    assert one(sandbox, code, ["assert rebind() == 0\nassert g() == 2"]).passed == [True]
    assert one(sandbox, code, ["assert g() == 1", "assert rebind() == 0"]).passed == [True, True]


def test_a_forged_first_reply_fails_only_its_own_program(sandbox):
    forge = ("import sys\nsvc = sys.modules['program'].Service\n"
             "svc.directory = lambda self: {'add': ['Z', 1]}\ndef add(a, b):\n    return a + b\n")
    res = sandbox.run([(forge, TESTS), ("def add(a, b):\n    return a + b\n", TESTS)])
    assert res[0].passed == [False, False] and "unreadable first reply" in res[0].detail[0], res[0]
    assert res[1].passed == [True, True]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to place")
def test_a_program_and_its_judge_run_on_one_core_and_programs_spread_over_the_cores(sandbox):
    """They call each other in turn: on one core each call is a plain switch (sandbox/forkserver_slots.py Cores)."""
    code = "import os\nCORES = sorted(os.sched_getaffinity(0))\n"
    allowed = sorted(os.sched_getaffinity(0))
    tests = ["assert len(CORES) == 1", "import os\nassert sorted(os.sched_getaffinity(0)) == CORES"]  # the judge's
    tests += [f"assert CORES != [{c}]" for c in allowed]  # the one that fails names the program's core
    res = sandbox.run([(code + f"# {k}\n", tests) for k in range(4 * sandbox.workers)])
    assert all(r.passed[:2] == [True, True] for r in res), [r.detail for r in res if r.passed[:2] != [True, True]]
    used = {allowed[r.passed[2:].index(False)] for r in res}
    assert len(used) > 1, used


def test_no_module_with_an_at_fork_handler_is_loaded_in_the_fork_server(sandbox):
    """The modules that register work for a forked child (`threading`, `random`, `logging`, ...) are not loaded in
    the fork server: that work would run in every child, and the template forks with libc's fork() alone
    (confine.can_fork_bare). A program that imports them gets them, freshly seeded."""
    from grpo_plugin.sandbox import confine

    code = (f"import sys\nloaded = [m for m in {confine.AT_FORK_MODULES!r} if m in sys.modules]\n"
            "import random, threading\ndraw = random.getrandbits(64)\n")
    res = sandbox.run([(code, ["assert loaded == []", "assert draw > 0"])])[0]
    assert res.passed == [True, True], res


def test_large_modules_programs_rarely_use_are_not_loaded_in_the_fork_server_and_import_as_usual(sandbox):
    """Every fork copies the page tables of what the template holds: `ast`, `ctypes`, `socket`, `fractions`,
    `decimal` are not loaded there (the sandbox uses the C halves of ctypes and socket), nor the judges' code; a
    program imports them."""
    names = ("ast", "ctypes", "socket", "selectors", "fractions", "decimal", "judge", "judge_link", "judge_stand_ins",
             "forkserver_plan")  # judge*.py: the judges' own; forkserver_plan.py: the server's, after the fork
    code = (f"import sys\nloaded = [m for m in {names!r} if m in sys.modules]\n"
            "import ast, ctypes, socket, fractions, decimal\n"
            "def f():\n    return fractions.Fraction(1, 3) + 1, decimal.Decimal('0.1'), ctypes.sizeof(ctypes.c_int)\n")
    tests = ["assert loaded == []", "from fractions import Fraction\nfrom decimal import Decimal\n"
             "assert f() == (Fraction(4, 3), Decimal('0.1'), 4)"]
    res = sandbox.run([(code, tests)])[0]
    assert res.passed == [True, True], res


def test_every_program_gets_its_limits_whether_its_own_or_inherited_from_the_template(sandbox):
    """Per process: CPU, address space, file size, descriptors, processes; from the template (confine_template):
    no core dumps, no message queues, no locked memory, no_new_privs. Seen from the program, and the same for the
    next program."""
    code = textwrap.dedent("""
        import ctypes, resource
        def limits():
            names = ("CPU", "AS", "FSIZE", "NOFILE", "NPROC", "CORE", "MSGQUEUE", "MEMLOCK")
            return {n: resource.getrlimit(getattr(resource, "RLIMIT_" + n))[1] for n in names}
        def nnp():
            return ctypes.CDLL(None).prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
    """)
    want = {"AS": 512 << 20, "NOFILE": 256, "NPROC": Limits().processes, "CORE": 0, "MSGQUEUE": 0, "MEMLOCK": 0}
    tests = [f"got = limits()\nassert all(got[k] == v for k, v in {want!r}.items()), got",
             "assert limits()['CPU'] >= 2 and limits()['FSIZE'] > 0", "assert nnp() == 1"]
    res = sandbox.run([(code + f"# {k}\n", tests) for k in range(2)])
    assert [r.passed for r in res] == [[True] * 3] * 2, [r.detail for r in res]


def test_a_program_runs_in_an_ordinary_process_after_the_bare_fork(sandbox):
    """What os.fork's bookkeeping would have set up in the child works as in a plain interpreter: threads (their
    own native ids, the main thread known), a signal handler, a fork of its own, and `random` seeded per process
    (programs draw different numbers)."""
    code = textwrap.dedent("""
        import os, random, signal, threading
        DRAW = random.getrandbits(64)
        def threads():
            ids = []
            t = [threading.Thread(target=lambda: ids.append(threading.get_native_id())) for _ in range(3)]
            for x in t: x.start()
            for x in t: x.join()
            main = threading.main_thread()
            return (main is threading.current_thread(), main.native_id == threading.get_native_id(),
                    len(set(ids) | {main.native_id}))
        def alarm():
            got = []
            signal.signal(signal.SIGALRM, lambda s, f: got.append(s))
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            while not got:
                pass
            return got == [signal.SIGALRM]
        def child():
            pid = os.fork()
            if pid == 0:
                os._exit(7)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        def draw():
            return DRAW
    """)
    tests = ["assert threads() == (True, True, 4)", "assert alarm()", "assert child() == 7"]
    res = sandbox.run([(code + "# one\n", tests + ["assert draw() > 0"]), (code + "# two\n", tests)])
    assert [r.passed for r in res] == [[True] * 4, [True] * 3], [r.detail for r in res]
    # the number each program drew, read back through the message of the test that fails with it (more programs
    # than templates: two of them forked from the same one)
    n = len(sandbox.template_pids) + 4
    draws = sandbox.run([(code + f"# {k}\n", ["raise ValueError(draw())"]) for k in range(n)])
    values = {r.detail[0] for r in draws}
    assert all(v.startswith("ValueError: ") for v in values) and len(values) == n, values


def test_a_virtualenv_under_tmp_stays_visible_in_the_jail():
    """The jail mounts its own /tmp: paths it binds from under the host's /tmp (a virtualenv there, its
    site-packages) must still be there inside, or every program importing from them fails."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from grpo_plugin.sandbox.jail import Jail

    d = Path(tempfile.mkdtemp(prefix="grpo-venv-", dir="/tmp"))
    try:
        d.chmod(0o755)
        (d / "marker.txt").write_text("site-packages here\n")
        (d / "marker.txt").chmod(0o644)
        jail = Jail.for_this_interpreter(str(Path(__file__).parent), 16)
        jail.readable.append(str(d))
        jail.prepare_identities()
        try:
            cmd, fds = jail.command(["/bin/cat", str(d / "marker.txt")])
            out = subprocess.run(cmd, pass_fds=fds, capture_output=True, text=True, timeout=60)
        finally:
            jail.close()
        assert out.returncode == 0 and out.stdout == "site-packages here\n", out.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_warm_up_answers_every_request_and_leaves_the_process_as_it_was(tmp_path):
    """The fork server's warm-up (program.warm_up) takes a program through the service's answers before the template is
    forked: every request answered as a program's process would (the last asks for a missing name: an error), and
    the fork server's working directory and environment put back (no program module left)."""
    from grpo_plugin.sandbox import program as child

    before = (os.getcwd(), dict(os.environ), list(sys.path), list(sys.argv), "solution" in sys.modules)
    kinds = child.warm_up(str(tmp_path))
    after = (os.getcwd(), dict(os.environ), list(sys.path), list(sys.argv), "solution" in sys.modules)
    assert kinds == ["ok"] * 35 + ["err"]
    assert after == before


def test_a_channel_splits_what_one_read_brings_into_its_messages_and_keeps_the_rest_for_itself():
    """wire.Channel reads a connection's length-prefixed messages, usually one read each: two messages that came in
    one read are two messages; a message larger than one read is read whole; one past the limit is a ValueError;
    the end of the connection is None; and bytes left over stay with their own connection."""
    import socket

    from grpo_plugin.sandbox import wire

    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        a.sendall(b"".join(len(m).to_bytes(4, sys.byteorder) + m for m in (b"one", b"two", b"x" * 200_000)))
        c.sendall((3).to_bytes(4, sys.byteorder) + b"cee")
        mine, other = wire.Channel(b.fileno()), wire.Channel(d.fileno())
        assert mine.recv(1 << 20) == b"one"
        assert other.recv(1 << 20) == b"cee"
        assert mine.recv(1 << 20) == b"two"
        assert mine.recv(1 << 20) == b"x" * 200_000
        a.sendall((10).to_bytes(4, sys.byteorder) + b"0123456789")
        with pytest.raises(ValueError, match="10 bytes"):
            mine.recv(9)
        a.close()
        assert mine.recv(1 << 20) is None
    finally:
        for s in (a, b, c, d):
            s.close()


def test_the_typing_aliases_programs_annotate_with_are_built_once_in_the_fork_server():
    """program.warm_typing builds the common aliases before the template is forked: a program's `List[int]` or
    `Dict[str, int]` is then a hit in typing's cache (nothing built in the program's process)."""
    import typing

    from grpo_plugin.sandbox import program as child

    assert child.warm_typing() > 50
    inner = typing._SpecialGenericAlias.__getitem__  # typing's lru cache behind it (3.12: in typing._caches)
    caches = getattr(typing, "_caches", None)
    cache = caches[inner.__wrapped__] if caches is not None else next(
        c.cell_contents for c in inner.__closure__ if hasattr(c.cell_contents, "cache_info"))
    before = cache.cache_info()
    program = "from typing import Dict, List\ndef f(xs: List[int], m: Dict[str, int]) -> List[str]:\n    return []\n"
    exec(compile(program, "solution.py", "exec", dont_inherit=True), {})  # its annotations evaluated, as a program's
    after = cache.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (3, 0)


def test_a_seccomp_filter_the_kernel_refuses_stops_the_sandbox_saying_so(monkeypatch):
    """The filter is loaded once, in the template, before it forks anything: if the kernel refuses it (here an
    injected program with no return instruction), no program runs without it, and the error says why."""
    from grpo_plugin.sandbox import SandboxError, jail

    monkeypatch.setattr(jail, "seccomp_program", lambda: bytes(8))
    sandbox = None
    try:  # the templates fail at once: the fork server may die before it says it is ready, or after
        with pytest.raises(SandboxError, match="could not load the seccomp filter"):
            sandbox = Sandbox(Limits(wall_s=2))
            sandbox.run([("def f():\n    return 1\n", ["assert f() == 1"])])
    finally:
        if sandbox is not None:
            sandbox.close()


def test_programs_at_once_default_to_two_per_core_and_six_more_never_past_five_per_core():
    """A program's time limit credits the time it waited for its core beside up to OTHERS_MOST others
    (forkserver_runs.py waited_for_cpu): more per core could time out a program that needs less than its limit."""
    from grpo_plugin.sandbox.client import default_workers
    from grpo_plugin.sandbox.forkserver_runs import OTHERS_MOST

    assert [default_workers(n) for n in (0, 1, 2, 3, 4, 16)] == [5, 5, 10, 12, 14, 38]
    assert all(default_workers(n) <= (OTHERS_MOST + 1) * n for n in range(1, 65))


def test_a_program_starts_with_nothing_of_the_fork_servers_for_the_collector_to_walk(sandbox):
    """What the fork server made before forking is frozen out of the collector's generations: a program's
    collection walks (and writes the headers of) only what its own process made, never pages it shares."""
    code = "import gc\nN = [len(gc.get_objects(g)) for g in range(3)]\ndef counts():\n    return N\n"
    res = one(sandbox, code, ["young, mid, old = counts()\nassert young < 100 and mid == old == 0, (young, mid, old)"])
    assert res.passed == [True], res


def test_a_sandbox_that_says_it_is_ready_has_its_templates_confined():
    """Every template holds no_new_privs, its seccomp filter and its shared limits by the time Sandbox() returns (its
    children inherit them): what a test or a user reads of it then is what it keeps."""
    for _ in range(4):
        with Sandbox() as sb:
            for pid in sb.template_pids:
                status = Path(f"/proc/{pid}/status").read_text()
                limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
                msgqueue = next(line for line in limits if line.startswith("Max msgqueue size")).split()
                assert "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status, status
                assert msgqueue[3:5] == ["0", "0"], msgqueue
