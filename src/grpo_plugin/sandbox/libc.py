"""libc's functions through `_ctypes`, the C half of ctypes, alone: the fork server never loads the `ctypes`
package (its ~0.2 MB of classes would be in every process a template forks, whose page tables each fork copies
and each exit unmaps). A program that imports ctypes gets the whole package as usual.

Standard library only (it runs inside the jail, in the fork server).
"""

from __future__ import annotations

import _ctypes
import os


class c_int(_ctypes._SimpleCData):
    _type_ = "i"


class c_long(_ctypes._SimpleCData):  # also ssize_t, on the 64-bit Linux this runs on
    _type_ = "l"


class c_size_t(_ctypes._SimpleCData):
    _type_ = "L"


class c_void_p(_ctypes._SimpleCData):
    _type_ = "P"


class c_char(_ctypes._SimpleCData):
    _type_ = "c"


_HANDLE = _ctypes.dlopen(None, os.RTLD_NOW)  # this process: libc and the interpreter itself


def address(name: str) -> int:
    """Where symbol `name` is in this process (libc's or the interpreter's)."""
    return _ctypes.dlsym(_HANDLE, name)


def function(name: str, restype=c_int, argtypes: list | None = None, keep_gil: bool = False):
    """libc's `name` as a callable (errno saved for get_errno). `keep_gil`: the interpreter's lock stays held
    across the call (as ctypes.PyDLL), else it is released (as ctypes.CDLL). Arguments without `argtypes`:
    small ints, and buffers (passed by address)."""
    flags = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO | (_ctypes.FUNCFLAG_PYTHONAPI if keep_gil else 0)
    kind = type(f"libc_{name}", (_ctypes.CFuncPtr,), {"_flags_": flags, "_restype_": restype})
    fn = kind(address(name))
    if argtypes is not None:
        fn.argtypes = argtypes
    return fn


def buffer(data: bytes, size: int | None = None):
    """A C buffer holding `data` (size: len(data) + 1 by default, zero-filled past the data)."""
    buf = (c_char * (len(data) + 1 if size is None else size))()
    buf.raw = data + bytes(len(buf) - len(data))
    return buf


addressof = _ctypes.addressof
get_errno = _ctypes.get_errno
