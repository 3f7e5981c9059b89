"""Scratch slots and cores, in the fork server (standard library only: it runs inside the jail). A slot is where one
program runs at a time: its own file system (a tmpfs of `slot_bytes`, where the jail allows mounting one), a fresh
directory under an unguessable name for every program, owned by the slot's uid, and the core its program and judge
share."""

from __future__ import annotations

import os
import sys

try:
    from . import confine
except ImportError:  # in the jail: top-level modules beside forkserver.py
    import confine


class Cores:
    """Each scratch slot's core, where its program and its judge both run: they call each other in turn (a
    request and a reply per call into the program), and on one core each call hands over with a plain switch,
    where across two cores each side pays a wake-up of the other core (about 2.5x the CPU per call on a 2-core
    VM). Slots are spread evenly over the cores this process may use, and a job takes a free slot on the core
    running the fewest programs. No pinning when there is a single core."""

    def __init__(self, cores: list[int]):
        self.cores = cores if len(cores) > 1 else []
        self.load = dict.fromkeys(self.cores, 0)

    def of(self, slot: int) -> int | None:
        return self.cores[slot % len(self.cores)] if self.cores else None

    def take(self, free: list[int]) -> int:
        """Take a slot out of `free` (not empty): one on the least loaded core."""
        k = min(range(len(free)), key=lambda i: self.load[self.of(free[i])]) if self.cores else len(free) - 1
        slot = free.pop(k)
        if self.cores:
            self.load[self.of(slot)] += 1
        return slot

    def beside(self, slot: int, running: int) -> int:
        """How many other programs run on `slot`'s core (`running`: all running programs, with a single core)."""
        return (self.load[self.of(slot)] if self.cores else running) - 1

    def give(self, slot: int) -> None:
        if self.cores:
            self.load[self.of(slot)] -= 1


class Slots:
    """The scratch slots: their roots, each one's current directory, which are free."""

    def __init__(self, root: str, workers: int, uids: bool, quota_bytes: int, cores: Cores):
        self.root, self.uids, self.quota_bytes, self.cores = root, uids, quota_bytes, cores
        self.roots = [self.slot_root(k) for k in range(workers)]
        self.quotas = sum(os.path.ismount(r) for r in self.roots)  # slots with a file system of their own
        self.paths = [self.new_dir(k) for k in range(workers)]
        self.free = list(range(workers))
        self.on_new_dir = None  # (slot, path): told each time a slot gets a new directory (its template's rules)

    def slot_root(self, k: int) -> str:
        """Slot k's own file system (a tmpfs of `slot_bytes`, at most 16k files): one program filling its scratch
        leaves the others theirs. Where no tmpfs can be mounted, a directory of the jail's shared one."""
        path = os.path.join(self.root, f"s{k}")
        os.mkdir(path, 0o711)
        if self.quota_bytes:
            try:
                confine.mount_tmpfs(path, self.quota_bytes, 16384)
            except OSError as exc:
                sys.stderr.write(f"sandbox: slot {k} shares the jail's scratch space: {exc}\n")
        return path

    def new_dir(self, k: int) -> str:
        """A fresh scratch directory for slot k's next program, under a name no other program can guess or list
        (the slot's root is not readable): nothing a program did to its directory (its mode, xattrs, times, what
        it left) reaches the next one."""
        path = os.path.join(self.roots[k], os.urandom(12).hex())
        os.mkdir(path, 0o700)
        if self.uids:
            os.chown(path, confine.program_uid(k), confine.program_uid(k))
        return path

    def take(self) -> int:
        """A free slot (there is one), on the least loaded core."""
        return self.cores.take(self.free)

    def release(self, slot: int) -> None:
        """Remove the program's scratch directory and make the slot's next one (new_dir)."""
        self.cores.give(slot)
        path = self.paths[slot]
        try:
            _remove_tree(path)
        except Exception as exc:  # noqa: BLE001 - what stays takes room in the slot, never the next program's view
            sys.stderr.write(f"sandbox: could not remove {path}: {exc}\n")
        try:
            self.paths[slot] = self.new_dir(slot)
            self.on_new_dir(slot, self.paths[slot])
        except OSError as exc:
            sys.stderr.write(f"sandbox: slot {slot} has no scratch directory: {exc}\n")
            return
        self.free.append(slot)


def _remove_tree(root: str) -> None:
    """Remove a scratch directory however deep, never following a link out of it; a directory
    whose permissions the program took away is given them back first. Raises OSError if something stays."""
    def listing(path):
        try:
            return list(os.scandir(path))
        except PermissionError:
            os.chmod(path, 0o700)
            return list(os.scandir(path))

    stack = [root]
    while stack:
        path = stack[-1]
        try:
            entries = listing(path)
        except FileNotFoundError:
            stack.pop()
            continue
        subdirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                try:
                    os.unlink(e.path)
                except FileNotFoundError:
                    pass
                except PermissionError:
                    os.chmod(path, 0o700)
                    os.unlink(e.path)
        if subdirs:
            stack.extend(subdirs)
            continue
        os.rmdir(path)
        stack.pop()
