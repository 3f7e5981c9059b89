"""The run-api's `/batch` reply, decoded without building a Python object per token.

A batch is mostly four per-token fields of every group: `tokens`, `masks` (integers), `inference_logprobs` and
the optional `advantages` (floats) — on a GSM8K-sized batch, 400k numbers in 3 MB of JSON. Decoding them into
Python lists (json / orjson) and then into arrays costs more than everything else the trainer does with a
batch. Here one compiled pass (numba, already a dependency of axolotl and vLLM) walks the JSON, parses those
four fields of each group straight into flat numpy arrays (+ per-sequence lengths), and cuts them out of the
text; orjson then decodes the small remainder (scores, overrides, generation_params, env_id, ...).

Anything unusual in one of the four fields (a string, a float where an id belongs, deeper nesting, a NaN
literal) makes the scanner give up, and the caller decodes the whole reply the ordinary way: the per-group
validation in tensorize.py then names the problem. Other fields may hold any JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

try:  # 5-10x faster than json on large replies; it refuses NaN / Infinity, for which json is the fallback
    import orjson
except ImportError:  # pragma: no cover - installed with vLLM
    orjson = None

FIELDS = ("tokens", "masks", "inference_logprobs", "advantages")
INT_FIELDS = (True, True, False, False)
MISSING = -1  # a group's count for a field it does not have (absent or null)

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba comes with axolotl and vLLM
    njit = None


@dataclass
class Columns:
    """Per field: each group's sequence count (MISSING when absent/null), each sequence's length, the values."""

    counts: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    values: dict[str, np.ndarray]


def loads(content: bytes):
    """JSON → Python objects (orjson, else the json module, which also reads NaN / Infinity)."""
    if orjson is not None:
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError:
            pass
    import json

    return json.loads(content)


def decode(raw: bytes) -> tuple[object, Columns | None]:
    """(the reply with the four per-token fields of each group set to None, their columns) — or, when the
    fast path does not apply, (the reply decoded in full, None)."""
    if _scan is not None and len(raw) > 256:
        buf = np.frombuffer(raw, dtype=np.uint8)
        out = _scan(buf, _P10)
        if out[0] == 0:
            return _assemble(raw, out)
    return loads(raw), None


def _assemble(raw: bytes, out) -> tuple[object, Columns]:
    (_, cuts, n_cuts, c0, c1, c2, c3, n_groups, l0, n0, l1, n1, l2, n2, l3, n3,
     v0, m0, v1, m1, v2, m2, v3, m3) = out
    pieces, last = [], 0
    for k in range(n_cuts):
        start, end = int(cuts[2 * k]), int(cuts[2 * k + 1])
        pieces.append(raw[last:start])
        pieces.append(b"null")
        last = end
    pieces.append(raw[last:])
    rest = loads(b"".join(pieces))
    cols = Columns(
        counts=dict(zip(FIELDS, (c0[:n_groups], c1[:n_groups], c2[:n_groups], c3[:n_groups]))),
        lengths=dict(zip(FIELDS, (l0[:n0], l1[:n1], l2[:n2], l3[:n3]))),
        values=dict(zip(FIELDS, (v0[:m0], v1[:m1], v2[:m2], v3[:m3]))))
    return rest, cols


_P10 = np.array([float(f"1e{k}") for k in range(309)])


if njit is not None:

    @njit(cache=True, nogil=True)
    def _ws(buf, i):
        n = buf.shape[0]
        while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
            i += 1
        return i

    @njit(cache=True, nogil=True)
    def _skip_string(buf, i):
        """At an opening quote: the index after the closing one (-1: unterminated)."""
        n = buf.shape[0]
        i += 1
        while i < n:
            c = buf[i]
            if c == 92:  # backslash: skip the escaped character
                i += 2
                continue
            if c == 34:
                return i + 1
            i += 1
        return -1

    @njit(cache=True, nogil=True)
    def _skip_value(buf, i):
        """Any JSON value starting at i: the index after it (-1: malformed)."""
        n = buf.shape[0]
        if i >= n:
            return -1
        c = buf[i]
        if c == 34:
            return _skip_string(buf, i)
        if c == 91 or c == 123:
            depth = 0
            while i < n:
                c = buf[i]
                if c == 34:
                    i = _skip_string(buf, i)
                    if i < 0:
                        return -1
                    continue
                if c == 91 or c == 123:
                    depth += 1
                elif c == 93 or c == 125:
                    depth -= 1
                    if depth == 0:
                        return i + 1
                i += 1
            return -1
        # number or literal: up to the next delimiter
        while i < n:
            c = buf[i]
            if c == 44 or c == 93 or c == 125 or c == 32 or c == 10 or c == 13 or c == 9:
                return i
            i += 1
        return i

    @njit(cache=True, nogil=True)
    def _grow_i(a, need):
        if need <= a.shape[0]:
            return a
        b = np.empty(max(need, 2 * a.shape[0]), dtype=a.dtype)
        b[: a.shape[0]] = a
        return b

    @njit(cache=True, nogil=True)
    def _key_id(buf, start, end):
        """Which of FIELDS the key bytes buf[start:end] (without quotes) name, else -1."""
        n = end - start
        if n == 6 and buf[start] == 116:  # tokens
            w = (116, 111, 107, 101, 110, 115)
            for k in range(6):
                if buf[start + k] != w[k]:
                    return -1
            return 0
        if n == 5 and buf[start] == 109:  # masks
            w5 = (109, 97, 115, 107, 115)
            for k in range(5):
                if buf[start + k] != w5[k]:
                    return -1
            return 1
        if n == 18 and buf[start] == 105:  # inference_logprobs
            w18 = (105, 110, 102, 101, 114, 101, 110, 99, 101, 95, 108, 111, 103, 112, 114, 111, 98, 115)
            for k in range(18):
                if buf[start + k] != w18[k]:
                    return -1
            return 2
        if n == 10 and buf[start] == 97:  # advantages
            w10 = (97, 100, 118, 97, 110, 116, 97, 103, 101, 115)
            for k in range(10):
                if buf[start + k] != w10[k]:
                    return -1
            return 3
        return -1

    # The two element loops below never grow their output (a reassigned array inside the per-element loop
    # costs numba about half the speed): they stop at the first element that does not fit and say so, and
    # _values grows the array and goes on from that element.
    DONE, BAD, FULL = 0, 1, 2

    @njit(cache=True, nogil=True)
    def _int_run(buf, i, dst, m, P10):  # P10 unused: the same signature as _float_run
        """Integers from the element at buf[i] on, written to dst[m:], up to the closing ']'.
        Returns (DONE: i after ']' | BAD | FULL: i at the element that did not fit, count written)."""
        n = buf.shape[0]
        cap = dst.shape[0]
        k = 0
        while True:
            while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
                i += 1
            if i >= n:
                return BAD, i, k
            if m + k >= cap:
                return FULL, i, k
            neg = buf[i] == 45
            if neg:
                i += 1
            start = i
            v = 0
            while i < n:
                d = np.int64(buf[i]) - 48
                if d < 0 or d > 9:
                    break
                v = v * 10 + d
                i += 1
            if i == start or i - start > 18:
                return BAD, i, k
            dst[m + k] = -v if neg else v
            k += 1
            if i < n and buf[i] == 44:  # the usual case: a comma right after the number
                i += 1
                continue
            while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
                i += 1
            if i < n and buf[i] == 44:
                i += 1
                continue
            if i < n and buf[i] == 93:
                return DONE, i + 1, k
            return BAD, i, k

    @njit(cache=True, nogil=True)
    def _float_run(buf, i, dst, m, P10):
        """JSON numbers from the element at buf[i] on, like _int_run. The value is the 18-digit mantissa scaled
        by a power of ten: within an ulp or two of the correctly rounded one."""
        n = buf.shape[0]
        cap = dst.shape[0]
        k = 0
        while True:
            while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
                i += 1
            if i >= n:
                return BAD, i, k
            if m + k >= cap:
                return FULL, i, k
            neg = buf[i] == 45
            if neg:
                i += 1
            start = i
            mant = 0
            digits = 0
            scale = 0
            while i < n:
                d = np.int64(buf[i]) - 48
                if d < 0 or d > 9:
                    break
                if digits < 18:
                    mant = mant * 10 + d
                    if mant > 0:
                        digits += 1
                else:
                    scale += 1
                i += 1
            if i == start:
                return BAD, i, k
            if i < n and buf[i] == 46:
                i += 1
                f0 = i
                while i < n:
                    d = np.int64(buf[i]) - 48
                    if d < 0 or d > 9:
                        break
                    if digits < 18:
                        mant = mant * 10 + d
                        if mant > 0:
                            digits += 1
                        scale -= 1
                    i += 1
                if i == f0:
                    return BAD, i, k
            if i < n and (buf[i] == 101 or buf[i] == 69):
                i += 1
                eneg = False
                if i < n and (buf[i] == 45 or buf[i] == 43):
                    eneg = buf[i] == 45
                    i += 1
                e0 = i
                e = 0
                while i < n:
                    d = np.int64(buf[i]) - 48
                    if d < 0 or d > 9:
                        break
                    if e < 10000:
                        e = e * 10 + d
                    i += 1
                if i == e0:
                    return BAD, i, k
                scale += -e if eneg else e
            v = float(mant)
            if scale < 0:
                v = v / P10[-scale] if -scale < 309 else 0.0
            elif scale > 0:
                v = v * P10[scale] if scale < 309 else np.inf
            dst[m + k] = -v if neg else v
            k += 1
            if i < n and buf[i] == 44:
                i += 1
                continue
            while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
                i += 1
            if i < n and buf[i] == 44:
                i += 1
                continue
            if i < n and buf[i] == 93:
                return DONE, i + 1, k
            return BAD, i, k

    @njit(cache=True, nogil=True)
    def _empty_list(buf, i):
        """At the first element of a list (just after '['): the index after ']' if the list is empty, else -1."""
        i = _ws(buf, i)
        return i + 1 if i < buf.shape[0] and buf[i] == 93 else -1

    @njit(cache=True, nogil=True)
    def _values(ints, buf, i, dst, m, P10):
        """Numbers from buf[i] (just after '[') up to the closing ']', parsed as integers (`ints`) or floats
        and appended to dst[m:] (grown as needed). Returns (ok, index after ']', count, dst)."""
        j = _empty_list(buf, i)
        if j >= 0:
            return True, j, 0, dst
        k = 0
        while True:
            if ints:  # (numba types both calls for either dst; only the matching one runs)
                status, i, got = _int_run(buf, i, dst, m + k, P10)
            else:
                status, i, got = _float_run(buf, i, dst, m + k, P10)
            k += got
            if status != FULL:
                return status == DONE, i, k, dst
            dst = _grow_i(dst, m + k + 1)

    @njit(cache=True, nogil=True)
    def _scan(buf, P10):
        """Walk {"batch": [group, ...], ...}; parse the FIELDS of each group. Status 0 = ok, else give up."""
        n = buf.shape[0]
        cuts = np.empty(64, np.int64)
        n_cuts = 0
        counts = np.full((4, 16), -1, np.int64)
        n_groups = 0
        lens = np.empty((4, 1024), np.int64)
        n_lens = np.zeros(4, np.int64)
        ivals0 = np.empty(n // 8 + 16, np.int64)
        ivals1 = np.empty(n // 8 + 16, np.int64)
        fvals2 = np.empty(n // 16 + 16, np.float64)
        fvals3 = np.empty(16, np.float64)
        n_vals = np.zeros(4, np.int64)
        fail = (1, cuts, 0, counts[0], counts[1], counts[2], counts[3], 0, lens[0], 0, lens[1], 0, lens[2], 0,
                lens[3], 0, ivals0, 0, ivals1, 0, fvals2, 0, fvals3, 0)

        i = _ws(buf, 0)
        if i >= n or buf[i] != 123:
            return fail
        i += 1
        while True:  # top-level keys
            i = _ws(buf, i)
            if i < n and buf[i] == 125:
                break
            if i >= n or buf[i] != 34:
                return fail
            kend = _skip_string(buf, i)
            if kend < 0:
                return fail
            is_batch = (kend - i == 7 and buf[i + 1] == 98 and buf[i + 2] == 97 and buf[i + 3] == 116
                        and buf[i + 4] == 99 and buf[i + 5] == 104)
            i = _ws(buf, kend)
            if i >= n or buf[i] != 58:
                return fail
            i = _ws(buf, i + 1)
            if is_batch and i < n and buf[i] == 91:
                i = _ws(buf, i + 1)
                if i < n and buf[i] == 93:
                    i += 1
                else:
                    while True:  # groups
                        i = _ws(buf, i)
                        if i >= n or buf[i] != 123:
                            return fail
                        if n_groups == counts.shape[1]:
                            grown = np.full((4, 2 * counts.shape[1]), -1, np.int64)
                            grown[:, : counts.shape[1]] = counts
                            counts = grown
                        g = n_groups
                        n_groups += 1
                        i += 1
                        while True:  # keys of one group
                            i = _ws(buf, i)
                            if i < n and buf[i] == 125:
                                i += 1
                                break
                            if i >= n or buf[i] != 34:
                                return fail
                            kend = _skip_string(buf, i)
                            if kend < 0:
                                return fail
                            f = _key_id(buf, i + 1, kend - 1)
                            i = _ws(buf, kend)
                            if i >= n or buf[i] != 58:
                                return fail
                            i = _ws(buf, i + 1)
                            if f < 0 or (i < n and buf[i] == 110):  # another key, or null: left to orjson
                                i = _skip_value(buf, i)
                                if i < 0:
                                    return fail
                            else:
                                if i >= n or buf[i] != 91:
                                    return fail
                                vstart = i
                                seqs = 0
                                i = _ws(buf, i + 1)
                                if i < n and buf[i] == 93:
                                    i += 1
                                else:
                                    while True:  # sequences
                                        i = _ws(buf, i)
                                        if i >= n or buf[i] != 91:
                                            return fail
                                        m = n_vals[f]
                                        if f == 0:
                                            ok, i, count, ivals0 = _values(True, buf, i + 1, ivals0, m, P10)
                                        elif f == 1:
                                            ok, i, count, ivals1 = _values(True, buf, i + 1, ivals1, m, P10)
                                        elif f == 2:
                                            ok, i, count, fvals2 = _values(False, buf, i + 1, fvals2, m, P10)
                                        else:
                                            ok, i, count, fvals3 = _values(False, buf, i + 1, fvals3, m, P10)
                                        if not ok:
                                            return fail
                                        n_vals[f] = m + count
                                        if n_lens[f] == lens.shape[1]:
                                            grown2 = np.empty((4, 2 * lens.shape[1]), np.int64)
                                            grown2[:, : lens.shape[1]] = lens
                                            lens = grown2
                                        lens[f, n_lens[f]] = count
                                        n_lens[f] += 1
                                        seqs += 1
                                        i = _ws(buf, i)
                                        if i < n and buf[i] == 44:
                                            i += 1
                                            continue
                                        if i < n and buf[i] == 93:
                                            i += 1
                                            break
                                        return fail
                                if counts[f, g] != -1:  # the same key twice: let the full decoder decide
                                    return fail
                                counts[f, g] = seqs
                                cuts = _grow_i(cuts, 2 * n_cuts + 2)
                                cuts[2 * n_cuts] = vstart
                                cuts[2 * n_cuts + 1] = i
                                n_cuts += 1
                            i = _ws(buf, i)
                            if i < n and buf[i] == 44:
                                i += 1
                                continue
                            if i < n and buf[i] == 125:
                                i += 1
                                break
                            return fail
                        i = _ws(buf, i)
                        if i < n and buf[i] == 44:
                            i += 1
                            continue
                        if i < n and buf[i] == 93:
                            i += 1
                            break
                        return fail
            else:
                i = _skip_value(buf, i)
                if i < 0:
                    return fail
            i = _ws(buf, i)
            if i < n and buf[i] == 44:
                i += 1
                continue
            if i < n and buf[i] == 125:
                break
            return fail
        return (0, cuts, n_cuts, counts[0].copy(), counts[1].copy(), counts[2].copy(), counts[3].copy(), n_groups,
                lens[0].copy(), n_lens[0], lens[1].copy(), n_lens[1], lens[2].copy(), n_lens[2], lens[3].copy(),
                n_lens[3], ivals0, n_vals[0], ivals1, n_vals[1], fvals2, n_vals[2], fvals3, n_vals[3])

else:  # pragma: no cover
    _scan = None
