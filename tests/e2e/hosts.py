""""Hosts" on this machine for the multi-host tests: network namespaces the test creates, joined by a veth pair (or,
for three, a bridge) of their own, with addresses that exist only inside them. A process started on a host also
gets a mount namespace of its own with a private /dev/shm (the sync directories' default root) and a PID namespace
of its own (its processes see no other host's); `private_tmp` gives it a private /tmp too, holding a copy of a
staging directory (the model and config the host reads). The code and the virtual environment are shared, as on
machines built from one image (a checkout under /tmp is bind-mounted back into the private /tmp).

Needs root and iproute2 / util-linux (`ip`, `unshare`); `available()` says why not, for a skip."""

from __future__ import annotations

import random
import secrets
import shutil
import subprocess
from pathlib import Path

import yaml

from grpo_plugin.bench.netns import ip, unavailable

# Runs as the host's first process: mounts its private /dev/shm (and /tmp), then execs the command.
_SETUP = r"""set -e
mount -t tmpfs "grpo-host" /dev/shm
if [ -n "$GRPO_HOST_STAGE" ]; then
  cp -a "$GRPO_HOST_STAGE" /dev/shm/.stage
  if [ -n "$GRPO_HOST_KEEP" ]; then  # the code (a checkout under /tmp) stays where it is
    mkdir /dev/shm/.keep && mount --bind "$GRPO_HOST_KEEP" /dev/shm/.keep
  fi
  mount -t tmpfs "grpo-host" /tmp
  if [ -n "$GRPO_HOST_KEEP" ]; then
    mkdir -p "$GRPO_HOST_KEEP" && mount --move /dev/shm/.keep "$GRPO_HOST_KEEP"
  fi
  cp -a /dev/shm/.stage /tmp/host
  rm -rf /dev/shm/.stage
fi
exec "$@"
"""


def own_mounts(argv: list[str], name: str, *, own_pids: bool = False) -> list[str]:
    """`argv` in a mount namespace of its own with a private /dev/shm (and, with GRPO_HOST_STAGE in its
    environment, a private /tmp); `own_pids`: in a PID namespace of its own too."""
    pids = ["--pid", "--fork", "--mount-proc"] if own_pids else []
    return ["unshare", "--mount", *pids, "--propagation", "private", "--", "sh", "-c", _SETUP, name, *argv]


def available() -> str | None:
    """None if hosts can be made here, else why not."""
    return unavailable() or (None if shutil.which("unshare") else "unshare not installed")


class Hosts:
    """Hosts on one link: `with Hosts(("a", "b")) as h: h.addr("b")`, `h.popen("b", [...])`. Two hosts are joined
    by a veth pair; more by a bridge in a namespace of its own (a switch)."""

    def __init__(self, names: tuple[str, ...] = ("a", "b")):
        token = secrets.token_hex(3)
        self.names = tuple(names)
        self.netns = {n: f"grpo-{token}-{n}" for n in self.names}
        self._switch = f"grpo-{token}-sw" if len(self.names) > 2 else None
        self.links = {n: f"g{token}{n}"[:15] for n in self.names}  # each host's interface
        net = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
        self._addrs = {n: f"{net}.{i + 1}" for i, n in enumerate(self.names)}

    def __enter__(self) -> Hosts:
        try:
            for ns in [*self.netns.values(), *([self._switch] if self._switch else [])]:
                ip("netns", "add", ns)
            if self._switch is None:
                a, b = self.names
                ip("link", "add", self.links[a], "type", "veth", "peer", "name", self.links[b])
            else:
                ip("-n", self._switch, "link", "add", "br0", "type", "bridge")
                ip("-n", self._switch, "link", "set", "br0", "up")
                for n in self.names:
                    port = f"s{self.links[n][1:]}"[:15]
                    ip("link", "add", self.links[n], "type", "veth", "peer", "name", port)
                    ip("link", "set", port, "netns", self._switch)
                    ip("-n", self._switch, "link", "set", port, "master", "br0")
                    ip("-n", self._switch, "link", "set", port, "up")
            for n in self.names:
                ip("link", "set", self.links[n], "netns", self.netns[n])
                ip("-n", self.netns[n], "addr", "add", f"{self._addrs[n]}/24", "dev", self.links[n])
                ip("-n", self.netns[n], "link", "set", self.links[n], "up")
                ip("-n", self.netns[n], "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in [*self.netns.values(), *([self._switch] if self._switch else [])]:  # the veths go with them
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def addr(self, name: str) -> str:
        return self._addrs[name]

    def link(self, name: str, up: bool) -> None:
        """Host `name`'s end of the link up or down (its address stays; nothing gets through while down)."""
        ip("-n", self.netns[name], "link", "set", self.links[name], "up" if up else "down")

    def popen(self, name: str, argv: list[str], *, log: Path, env: dict, cwd: Path,
              private_tmp: Path | None = None) -> subprocess.Popen:
        """`argv` on host `name`, output to `log`, in a session of its own (its process group is the test's to
        signal). `private_tmp`: the host's /tmp is its own, holding a copy of that directory at /tmp/host."""
        env = dict(env)
        env.pop("GRPO_HOST_STAGE", None)
        env["GLOO_SOCKET_IFNAME"] = self.links[name]  # torch.distributed's gloo: this host's link, not a loopback
        if private_tmp is not None:
            env["GRPO_HOST_STAGE"] = str(private_tmp)
            # a checkout under /tmp (CI clones there) would vanish under the private /tmp: it is kept, alone
            env["GRPO_HOST_KEEP"] = str(cwd) if Path(cwd).resolve().is_relative_to("/tmp") else ""
        cmd = ["ip", "netns", "exec", self.netns[name], *own_mounts(argv, f"grpo-host-{name}", own_pids=True)]
        with log.open("ab") as out:
            return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)


def server_host_copy(stage: Path, cfg: dict, model_dir: Path, data_file: Path) -> str:
    """What a server host has of its own (its /tmp is private: `Hosts.popen(..., private_tmp=stage)`): a copy of
    the model and the data, and the config with its paths there. Returns that config's path as the host sees it."""
    shutil.copytree(model_dir, stage / "model")
    shutil.copy(data_file, stage / "data.jsonl")
    there = {**cfg, "base_model": "/tmp/host/model", "dataset_prepared_path": "/tmp/host/prepared",
             "output_dir": "/tmp/host/out", "datasets": [{**cfg["datasets"][0], "path": "/tmp/host/data.jsonl"}]}
    (stage / "cfg.yaml").write_text(yaml.safe_dump(there))
    return "/tmp/host/cfg.yaml"
