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
import socket
import subprocess
import sys
import threading
import time
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


# the far end of a link measurement: accepts `streams` connections at once, reads each to its end, answers with the
# bytes it read (run with this machine's python, in the namespace for a veth link)
_RECEIVER = """
import socket, sys, threading
srv = socket.socket(); srv.bind((sys.argv[1], 0)); srv.listen(16)
print(srv.getsockname()[1], flush=True)
def drain(c):
    buf, n = bytearray(1 << 20), 0
    while (k := c.recv_into(buf)):
        n += k
    c.sendall(str(n).encode()); c.close()
ts = []
for _ in range(int(sys.argv[2])):
    c, _ = srv.accept(); t = threading.Thread(target=drain, args=(c,)); t.start(); ts.append(t)
for t in ts:
    t.join()
"""


def tcp_rate(host: str, netns: str | None = None, mib: int = 1024, streams: int = 1) -> float:
    """The link's own rate: `mib` MiB sent over `streams` plain TCP connections to a receiver at `host` (in network
    namespace `netns`, or this one), from the first connect to the last byte acknowledged: MiB/s. Raises if a
    stream's bytes did not all arrive."""
    cmd = [sys.executable, "-c", _RECEIVER, host, str(streams)]
    proc = subprocess.Popen(["ip", "netns", "exec", netns, *cmd] if netns else cmd, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        share = mib * 2**20 // streams
        chunk = memoryview(bytes(4 << 20))
        got: list[int] = []

        def send() -> None:
            with socket.create_connection((host, port), timeout=120) as c:
                left = share
                while left:
                    left -= c.send(chunk[:min(left, len(chunk))])
                c.shutdown(socket.SHUT_WR)
                got.append(int(c.recv(64)))

        threads = [threading.Thread(target=send) for _ in range(streams)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if got != [share] * streams:
            raise RuntimeError(f"the link lost bytes: {got} of {share} per stream arrived")
        return round(mib / elapsed, 1)
    finally:
        proc.wait(timeout=60)
