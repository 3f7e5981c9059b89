"""The code sandbox as most users run it: as an ordinary user, not root (docs/code.md, "What the sandbox needs").

With subordinate ids (/etc/subuid, /etc/subgid, the setuid `newuidmap` helpers of the `uidmap` package) the jail maps
a uid per scratch slot exactly as for root; without them the sandbox refuses to start unless the user accepts running
without separate identities, and says so. The cgroups the trainer may not make are named as missing.

Each case runs a trainer-side Python as uid 1000 (`setpriv`) in a private mount namespace the test makes as root:
an /etc of its own (the user's passwd line and, where the case wants them, its subordinate ids) and the directories
on the way to the interpreter, the virtualenv and this checkout made traversable (under /root they are not). Nothing
of the machine's own /etc or directories changes. Skipped where the test cannot switch users (not root, no
`unshare`/`setpriv`)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(180)
UID = 1000
CHECK = """
import json, os
from grpo_plugin.sandbox import Limits, Sandbox, SandboxUnavailable
out = {}
try:
    with Sandbox(Limits(wall_s=3), workers=2) as sb:
        out["isolation"], out["cgroups_missing"] = sb.isolation, sb.cgroups_missing
        res = sb.run([("def f(x):\\n    return x + 1\\n", ["assert f(1) == 2", "assert f(2) == 3"]),
                      ("def f(x):\\n    return x\\n", ["assert f(1) == 2"]),
                      ("import os\\nuid = os.getuid()\\n", ["assert uid >= 100000, uid"])])
        out["scores"] = [r.score for r in res]
except SandboxUnavailable as exc:
    out["refused"] = str(exc)
print("RESULT " + json.dumps(out))
"""


def _closed_dirs(paths: list[str]) -> list[str]:
    """The topmost directories on the way to `paths` that other users may not traverse (e.g. /root)."""
    out: list[str] = []
    for p in paths:
        parts = Path(p).parts
        for k in range(2, len(parts) + 1):
            d = str(Path(*parts[:k]))
            if os.path.isdir(d) and not os.stat(d).st_mode & stat.S_IXOTH:
                if d not in out:
                    out.append(d)
                break
    return out


def _as_ordinary_user(tmp_path: Path, subids: bool, env: dict[str, str]) -> dict:
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # each call's own /etc copy and mount points
    needed = [os.path.realpath(sys.base_prefix), sys.prefix, str(ROOT)]
    script = ["set -e", f"cp -a /etc {tmp_path}/etc",
              f"grep -v ':{UID}:' /etc/passwd > {tmp_path}/etc/passwd || true",
              f"echo 'grpotest:x:{UID}:{UID}::/tmp:/bin/sh' >> {tmp_path}/etc/passwd",
              f"rm -f {tmp_path}/etc/subuid {tmp_path}/etc/subgid"]
    if subids:
        script += [f"echo 'grpotest:200000:65536' > {tmp_path}/etc/{f}" for f in ("subuid", "subgid")]
    script.append(f"mount --bind {tmp_path}/etc /etc")
    for k, closed in enumerate(_closed_dirs(needed)):  # a traversable tmpfs there, the ways through bound back
        keep = tmp_path / f"keep{k}"
        keep.mkdir()
        script += [f"mount --bind {closed} {keep}", f"mount -t tmpfs -o mode=755 tmpfs {closed}"]
        for child in sorted({Path(p).relative_to(closed).parts[0] for p in needed if p.startswith(closed + "/")}):
            script += [f"mkdir -p {closed}/{child}", f"mount --bind {keep}/{child} {closed}/{child}"]
    script.append(f'exec setpriv --reuid {UID} --regid {UID} --clear-groups --inh-caps=-all "$@"')
    user_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", **env}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", "\n".join(script), "bash",
                           "env", *[f"{k}={v}" for k, v in user_env.items()], sys.executable, "-c", CHECK],
                          cwd=tmp_path, capture_output=True, text=True, timeout=150)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture
def can_switch_users():
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("switching to an ordinary user needs root, `unshare` and `setpriv`")


def test_an_ordinary_user_with_subordinate_ids_gets_a_uid_per_slot(tmp_path, can_switch_users):
    if not (shutil.which("newuidmap") and shutil.which("newgidmap")):
        pytest.skip("no newuidmap/newgidmap on this machine (the `uidmap` package; CI installs it)")
    out = _as_ordinary_user(tmp_path, subids=True, env={})
    assert "refused" not in out, out
    assert "a uid per scratch slot for programs" in out["isolation"], out
    assert out["scores"] == [1.0, 0.0, 1.0], out  # the third: the program runs as a slot's uid, not the user's
    assert "cgroup per slot" not in out["isolation"] and "may not make cgroups" in out["cgroups_missing"], out


def test_without_subordinate_ids_it_refuses_unless_told_and_then_says_what_is_shared(tmp_path, can_switch_users):
    out = _as_ordinary_user(tmp_path, subids=False, env={})
    assert "identity" in out.get("refused", ""), out
    assert "GRPO_SANDBOX_ACCEPT_MISSING=identity" in out["refused"], out
    assert "/etc/subuid" in out["refused"] or "newuidmap" in out["refused"], out  # what to do about it
    accepted = _as_ordinary_user(tmp_path, subids=False, env={"GRPO_SANDBOX_ACCEPT_MISSING": "identity"})
    assert "every capability dropped (no separate uid)" in accepted["isolation"], accepted
    assert accepted["scores"][:2] == [1.0, 0.0], accepted
    assert accepted["scores"][2] == 0.0, accepted  # no uid of its own: the program runs as the user
