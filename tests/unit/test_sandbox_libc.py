"""libc through _ctypes alone (sandbox/libc.py): what the fork server calls instead of loading the ctypes package."""

import os
import struct
import sys

from grpo_plugin.sandbox import libc


def test_functions_return_what_libc_returns_and_keep_errno():
    syscall = libc.function("syscall", libc.c_long)
    assert syscall(39) == os.getpid()  # SYS_getpid on x86-64
    assert syscall(1 << 20) == -1 and libc.get_errno() == 38  # ENOSYS
    prctl = libc.function("prctl")
    assert prctl(3, 0, 0, 0, 0) in (0, 1)  # PR_GET_DUMPABLE


def test_buffers_hold_their_bytes_and_addresses_take_64_bit_arguments():
    data = struct.pack("=QQ", 1, 1 << 40)
    buf = libc.buffer(data)
    assert len(buf) == len(data) + 1 and bytes(buf.raw) == data + b"\0"
    assert bytes(libc.buffer(b"ab", 4).raw) == b"ab\0\0"
    memmove = libc.function("memmove", libc.c_void_p, [libc.c_void_p, libc.c_void_p, libc.c_size_t])
    out = libc.buffer(b"", 16)
    memmove(libc.addressof(out), libc.addressof(buf), 16)
    assert bytes(out.raw) == data
    assert libc.c_long.from_address(libc.addressof(buf) + 8).value == 1 << 40
    assert libc.address("Py_IncRef") > 0  # the interpreter's own symbols resolve too


def _fresh(code: str) -> str:
    """stdout of `code` in a fresh single-threaded interpreter with libc.py importable (a pytest-xdist worker runs
    threads: a bare fork there may leave the child waiting for a thread it does not have, can_fork_bare)."""
    import subprocess

    return subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); " + code,
                           os.path.dirname(libc.__file__)], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def test_fork_holding_the_interpreter_lock():
    code = ("import os, libc\npid = libc.function('fork', libc.c_int, [], keep_gil=True)()\n"
            "if pid == 0:\n    os._exit(7)\n"
            "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))")
    assert _fresh(code) == "7"


def test_it_does_not_load_the_ctypes_package():
    assert _fresh("import libc; libc.function('getpid')(); print('ctypes' in sys.modules)") == "False"
