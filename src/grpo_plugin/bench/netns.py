"""A link that is not the loopback, on one machine: a network namespace of the benchmark's own, joined to this one
by a veth pair, with addresses that exist only on that pair. A server started in it (`ServerInNamespace`) is
reached over the pair; it shares this machine's filesystem, so both weight transports can be timed against it.

Needs root and iproute2 (`ip`); `unavailable()` says why not. The namespace (and with it the pair) is deleted at
exit."""

from __future__ import annotations

import os
import random
import secrets
import shutil
import subprocess
from dataclasses import dataclass

from grpo_plugin.server.process import ServerSpec


def unavailable() -> str | None:
    """None if the link can be made here, else why not."""
    if os.geteuid() != 0:
        return "a network namespace needs root"
    return None if shutil.which("ip") else "iproute2 (`ip`) is not installed"


def ip(*args: str) -> None:
    """`ip ARGS` (iproute2); a failure raises with what `ip` said."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class VethLink:
    """`with VethLink() as link:` a namespace `link.netns` at `link.peer`, this side at `link.here`."""

    def __init__(self):
        token = secrets.token_hex(3)
        self.netns = f"grpo-bench-{token}"
        self.here_if, self.peer_if = f"gb{token}a", f"gb{token}b"  # this side's interface, the namespace's
        net = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
        self.here, self.peer = f"{net}.1", f"{net}.2"

    def __enter__(self) -> VethLink:
        why = unavailable()
        if why:
            raise RuntimeError(f"cannot make a veth link: {why}")
        try:
            ip("netns", "add", self.netns)
            ip("link", "add", self.here_if, "type", "veth", "peer", "name", self.peer_if)
            ip("link", "set", self.peer_if, "netns", self.netns)
            ip("addr", "add", f"{self.here}/24", "dev", self.here_if)
            ip("link", "set", self.here_if, "up")
            ip("-n", self.netns, "addr", "add", f"{self.peer}/24", "dev", self.peer_if)
            ip("-n", self.netns, "link", "set", self.peer_if, "up")
            ip("-n", self.netns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)  # the pair goes with it


@dataclass
class ServerInNamespace(ServerSpec):
    """A server spec whose process runs in network namespace `netns` (host: its address there)."""

    netns: str = ""

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *super().command()]
