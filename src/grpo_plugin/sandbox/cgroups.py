"""A kernel layer, made by the trainer before the jail starts: per scratch slot, a memory and a pids cgroup for its
programs (`slot-<k>`) and another for its judge (`judge-<k>`), so that a program's processes together (threads,
children, the shared memory and the tmpfs pages they write) stay within one budget of their own, whatever each
process's rlimits allow, no program's budget is another's, and a judge (with the processes it forks for its jobs)
holds at most its own budget; and, where the kernel offers the cpu controller, a cpu cgroup for each of them, of
equal weight: the scheduler shares a core between these groups first, so however many processes or sessions
(`setsid`: an autogroup each, outside a cgroup) a program starts, together they get one group's share of its core.

Only a subtree of the trainer's own cgroup is made (`grpo-sandbox-<pid>` under the cgroup this process is in),
never a change to the machine's cgroups. The jail sees that subtree (bound at JAIL_ROOT/<controller>); a program's
or judge's process joins its cgroups first thing (forked.py), before it is confined. Where the kernel does not let
this process make them (no cgroup v1 memory/pids hierarchy it may write, and no cgroup v2 subtree delegated to it
with both controllers), the sandbox runs without, and says so (Sandbox.isolation, docs/code.md): each process then
has its own address-space and process limits only. Where only the cpu controller is missing, the memory and pids
cgroups are made and `SlotCgroups.cpu_missing` says why there is no cpu one.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

JAIL_ROOT = "/grpo/cgroup"
CONTROLLERS = ("memory", "pids")  # needed; "cpu" is made where the kernel offers it
CPU_SHARES, CPU_WEIGHT = 1024, 100  # every slot's programs and judge: the same weight (cgroup v1, v2)
_PREFIX = "grpo-sandbox-"


@dataclass
class SlotCgroups:
    """The subtree made for one sandbox: `dirs` (controller -> its `grpo-sandbox-<pid>` directory on this machine)."""

    dirs: dict[str, Path] = field(default_factory=dict)
    unified: bool = False  # cgroup v2: one directory holds every controller
    cpu_missing: str = ""  # why there is no cpu cgroup per slot (empty: there is one)

    def jail_dirs(self) -> list[str]:
        """Where the fork server's processes find each controller's subtree inside the jail."""
        return [f"{JAIL_ROOT}/{name}" for name in self.dirs]

    def binds(self) -> list[str]:
        """bwrap arguments that show the subtree inside the jail (read-write: a process joins by writing to it)."""
        out: list[str] = []
        for name, path in self.dirs.items():
            out += ["--bind", str(path), f"{JAIL_ROOT}/{name}"]
        return out

    def peak_bytes(self, slot: int, role: str = "slot") -> int:
        """The most memory slot `slot`'s programs (`role` "slot") or its judge ("judge") have used at once (0 where
        the kernel does not say)."""
        d = self.dirs.get("memory", self.dirs.get("unified"))
        if d is None:
            return 0
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            try:
                return int((d / f"{role}-{slot}" / name).read_text())
            except (OSError, ValueError):
                continue
        return 0

    def remove(self, timeout: float = 5.0) -> None:
        """Remove the subtree (its processes are gone or going: an exiting process leaves its cgroup a moment
        later, so an `EBUSY` is tried again until `timeout`)."""
        deadline = time.monotonic() + timeout
        for path in self.dirs.values():
            for d in [*sorted(path.glob("slot-*")), *sorted(path.glob("judge-*")), path]:
                while True:
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.05)
        self.dirs = {}


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per v1 controller ("memory" -> "/a/b") and, as "", its v2 one."""
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            for name in names.split(",") if names else [""]:
                out[name] = path
    except (OSError, ValueError):
        pass
    return out


def _mounts() -> dict[str, str]:
    """Mount point of each v1 controller's hierarchy ("memory" -> "/sys/fs/cgroup/memory") and, as "", cgroup2's."""
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            if parts[2] == "cgroup2":
                out.setdefault("", parts[1])
            elif parts[2] == "cgroup":
                for opt in parts[3].split(","):
                    if opt in (*CONTROLLERS, "cpu"):
                        out.setdefault(opt, parts[1])
    except OSError:
        pass
    return out


def _collect_stale(parent: Path) -> None:
    """Remove what earlier sandboxes of processes now gone left under `parent` (a trainer killed with -9)."""
    try:
        entries = list(parent.glob(_PREFIX + "*"))
    except OSError:
        return
    for d in entries:
        try:
            pid = int(d.name[len(_PREFIX):].split("-")[0])
        except ValueError:
            continue
        if pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        SlotCgroups({"x": d}).remove(timeout=0.5)


def make(slots: int, memory_bytes: int, processes: int, judge_memory_bytes: int | None = None,
         judge_processes: int = 64) -> tuple[SlotCgroups | None, str]:
    """Per slot, a memory and a pids cgroup for its programs (`memory_bytes`, `processes`) and one for its judge
    (`judge_memory_bytes`, `judge_processes`), and a cpu cgroup each where the kernel offers one, under this
    process's own cgroups; (None, why) where the kernel does not let this process make them."""
    own, mounts = _own_cgroups(), _mounts()
    name = f"{_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    made = SlotCgroups()
    try:
        if all(c in mounts and c in own for c in CONTROLLERS):  # cgroup v1 (or hybrid): a hierarchy each
            for c in CONTROLLERS:
                parent = Path(mounts[c] + own[c])
                _collect_stale(parent)
                made.dirs[c] = parent / name
                made.dirs[c].mkdir()
            made.cpu_missing = _make_v1_cpu(made, mounts, own, name)
        elif "" in mounts and "" in own:  # cgroup v2: only where both controllers are delegated to our subtree
            parent = Path(mounts[""] + own[""])
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            if not all(c in enabled for c in CONTROLLERS):
                return None, (f"the cgroup v2 subtree this process is in ({parent}) does not delegate the memory "
                              f"and pids controllers (cgroup.subtree_control: {' '.join(enabled) or 'none'})")
            _collect_stale(parent)
            made.unified = True
            made.dirs["unified"] = parent / name
            made.dirs["unified"].mkdir()
            wanted = "+memory +pids" + (" +cpu" if "cpu" in enabled else "")
            (made.dirs["unified"] / "cgroup.subtree_control").write_text(wanted)
            if "cpu" not in enabled:
                made.cpu_missing = (f"the cgroup v2 subtree this process is in ({parent}) does not delegate the cpu "
                                    "controller")
        else:
            return None, "no cgroup hierarchy with the memory and pids controllers is mounted"
        cpu = made.dirs.get("cpu") or (made.dirs["unified"] if made.unified and not made.cpu_missing else None)
        if cpu is not None:  # the subtree weighs what its groups would weigh each on their own beside the
            # machine's other processes (one group's weight would make all programs together one process there)
            v1 = not made.unified
            (cpu / ("cpu.shares" if v1 else "cpu.weight")).write_text(
                str(min(2 * slots * (CPU_SHARES if v1 else CPU_WEIGHT), 262144 if v1 else 10000)))
        budgets = {"slot": (memory_bytes, processes),
                   "judge": (judge_memory_bytes or memory_bytes, judge_processes)}
        for k in range(slots):
            for role, (mem, procs) in budgets.items():
                for c, path in made.dirs.items():
                    d = path / f"{role}-{k}"
                    d.mkdir()
                    settings = {"memory": [("memory.limit_in_bytes", mem),  # then swap + memory: no swap
                                           ("memory.memsw.limit_in_bytes", mem)],
                                "pids": [("pids.max", procs)],
                                "cpu": [("cpu.shares", CPU_SHARES)],
                                "unified": [("memory.max", mem), ("memory.swap.max", 0), ("pids.max", procs),
                                            ("cpu.weight", CPU_WEIGHT)]}[c]
                    for i, (file, value) in enumerate(settings):
                        if i == 0 or (d / file).exists():  # swap's files exist only where swap is accounted
                            (d / file).write_text(str(value))
    except OSError as exc:
        made.remove(timeout=0.5)
        return None, f"this process may not make cgroups under its own ({exc.strerror or exc}: {exc.filename})"
    return made, ""


def _make_v1_cpu(made: SlotCgroups, mounts: dict[str, str], own: dict[str, str], name: str) -> str:
    """The cgroup v1 cpu hierarchy's subtree, where this process may make one; else why not."""
    if "cpu" not in mounts or "cpu" not in own:
        return "no cgroup v1 hierarchy with the cpu controller is mounted"
    parent = Path(mounts["cpu"] + own["cpu"])
    try:
        _collect_stale(parent)
        (parent / name).mkdir()
    except OSError as exc:
        return f"this process may not make cpu cgroups under its own ({exc.strerror or exc}: {exc.filename})"
    made.dirs["cpu"] = parent / name
    return ""
