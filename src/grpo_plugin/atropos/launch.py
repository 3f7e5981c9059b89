"""One command for an Atropos run: `python -m grpo_plugin.atropos.launch CONFIG.yaml [-- axolotl train args]`.

Starts, in the order the run-api needs, and stops at the end (or on Ctrl-C / a crash) exactly those processes:
1. the Atropos run-api on the port of `grpo.atropos.url` (`run-api --host H --port P`);
2. the config's vLLM server(s), as `axolotl vllm-serve CONFIG` starts them (server/process.py `start_servers`,
   without axolotl's CLI around it: ~25 s of imports less per start) (skipped with `grpo.managed_server: true`:
   then the trainer starts it);
3. the trainer, `axolotl train CONFIG` (its output goes to this terminal);
4. once the trainer has registered with the run-api, every environment in `grpo.atropos.envs`, as
   `python -m <module> serve` with the flags that point it at this run-api, this server and this model
   (`--env.tokenizer_name --env.rollout_server_url [--env.group_size] --openai.base_url --openai.model_name
   --openai.tokenizer_name --openai.server_type vllm --openai.api_key`) followed by the env's own `args`.

Logs of the other processes go to `<output_dir>/atropos_logs/`. A port already taken is an error (nothing is
killed); an environment that crashes stops the run with the end of its log. The exit code is the trainer's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import requests
import yaml

from grpo_plugin.config import runtime
from grpo_plugin.config.lookups import run_config
from grpo_plugin.config.runtime import SERVER_PORT
from grpo_plugin.config.views import RunConfig
from grpo_plugin.server.client import VLLMServerClient
from grpo_plugin.server.process import (
    Progress,
    ServerStartError,
    VLLMServerProcess,
    port_in_use,
    specs_from,
    start_servers,
    stop_tree,
    wait_until,
)
from grpo_plugin.server.tether import kept

BIN = Path(sys.executable).parent


class LaunchError(RuntimeError):
    pass


def _say(msg: str) -> None:
    print(f"[grpo_plugin launch] {msg}", file=sys.stderr, flush=True)


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def env_command(module: str, run: RunConfig, args: list[str]) -> list[str]:
    """The command line of one environment process."""
    settings = run.grpo.atropos
    base = runtime.server_url(run.vllm.host, int(run.vllm.port or SERVER_PORT))
    model = str(run.base_model)
    cmd = [sys.executable, "-m", module, "serve",
           "--env.tokenizer_name", model, "--env.rollout_server_url", settings.url]
    if settings.group_size:
        cmd += ["--env.group_size", str(settings.group_size)]
    cmd += ["--openai.base_url", f"{base}/v1", "--openai.model_name", model,
            "--openai.tokenizer_name", model, "--openai.server_type", "vllm", "--openai.api_key", "none"]
    return cmd + list(args)


MAX_RESTARTS = 3  # per process the launcher restarts


class Launch:
    def __init__(self, config: Path, run: RunConfig, train_args: list[str]):
        """`run`: the config's views (its `grpo:` block validated, with its `atropos:` block)."""
        self.config, self.views, self.grpo, self.train_args = config, run, run.grpo, train_args
        self.settings = run.grpo.atropos
        self.logs = Path(run.output_dir or "outputs") / "atropos_logs"
        self.procs: list[tuple[str, subprocess.Popen]] = []  # (name, process), in start order
        self.trainer: subprocess.Popen | None = None
        self._log_files = []
        self.restartable: dict[int, tuple] = {}  # pid -> (name, how to start it again, log)
        self.restarts: dict[str, int] = {}  # name -> times started again
        self.servers: dict[int, VLLMServerProcess] = {}  # pid -> a vLLM server this launcher started

    def _start(self, name: str, cmd: list[str], log: Path | None, *, again=None) -> subprocess.Popen:
        """Start `cmd` (its output appended to `log`). `again()`: what `_watch` calls when it ends (the run-api
        and the server this launcher started are started again: the trainer recovers from their loss)."""
        out = None
        if log is not None:
            out = log.open("ab")
            self._log_files.append(out)
        env = dict(os.environ)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # axolotl execs `accelerate` from PATH
        # its own group (we stop it, and only it), kept: the command and every process it starts end with this
        # launcher, even when it is SIGKILLed
        proc = subprocess.Popen(kept(cmd), stdout=out, stderr=subprocess.STDOUT if out else None,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.procs.append((name, proc))
        if again is not None:
            self.restartable[proc.pid] = (name, again, log)
        _say(f"started {name} (pid {proc.pid}){f', log {log}' if log else ''}")
        return proc

    def _alive_or_fail(self, name: str, proc: subprocess.Popen, log: Path | None) -> None:
        code = proc.poll()
        if code is not None:
            raise LaunchError(f"{name} exited with code {code} during start-up" +
                              (f"; the end of {log}:\n{_tail(log)}" if log else ""))

    def run(self) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        api = urlparse(self.settings.url)
        if port_in_use(api.hostname, api.port):
            raise LaunchError(f"port {api.port} (grpo.atropos.url {self.settings.url}) is already in use. Stop "
                              "that program yourself, or change grpo.atropos.url. Nothing was killed.")
        self._start_run_api()
        if not self.grpo.managed_server:
            self._start_server()
        self.trainer = self._start("trainer (axolotl train)",
                                   [str(BIN / "axolotl"), "train", str(self.config), *self.train_args], None)
        if not self._wait_registered():
            return self.trainer.wait()
        self._start_envs()
        if not self.settings.envs:
            _say("grpo.atropos.envs is empty: start your environments yourself now")
        return self._watch()

    def _start_run_api(self) -> None:
        api = urlparse(self.settings.url)
        log = self.logs / "run_api.log"
        run_api = self._start("Atropos run-api", [str(BIN / "run-api"), "--host", api.hostname, "--port",
                                                  str(api.port)], log, again=self._run_api_again)

        def api_up() -> bool:
            self._alive_or_fail("the run-api", run_api, log)
            try:
                return requests.get(f"{self.settings.url}/", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        if wait_until(api_up, 120, Progress("starting the Atropos run-api"), lambda _: "starting",
                      ready="ready", poll=0.5) is None:
            raise LaunchError(f"the run-api did not answer within 120 s; the end of {log}:\n{_tail(log)}")

    def _run_api_again(self) -> None:
        """A fresh run-api knows neither the trainer nor the environments: the trainer registers again by itself
        (its fetcher), the environments are started again after it."""
        self._start_run_api()
        if self._wait_registered():
            for name, proc in [x for x in self.procs if x[0].startswith("environment")]:
                stop_tree(proc, timeout=30)
                self.procs.remove((name, proc))
            self._start_envs()

    def _start_envs(self) -> None:
        for i, env in enumerate(self.settings.envs):
            self._start(f"environment {i} ({env.module})", env_command(env.module, self.views, env.args),
                        self.logs / f"env_{i}.log")

    def _start_server(self) -> None:
        """The config's vLLM server(s), watched like the other processes: one that ends is started again on its
        own (`_server_again`); each is stopped through its VLLMServerProcess, which also removes an ipc server's
        shared weight file."""
        logs = self.logs
        with _as_launch_error():  # a port already taken names it; nothing is killed
            servers = start_servers(specs_from(served(self.views)), log_path=lambda i: logs / (
                "vllm_serve.log" if i == 0 else f"vllm_serve_{i}.log"))
        for server in servers:
            self._watch_server(server, "vLLM server" + (f" :{server.spec.port}" if len(servers) > 1 else ""))
        for server in servers:
            self._wait_healthy(server)

    def _watch_server(self, server: VLLMServerProcess, name: str) -> None:
        self.procs.append((name, server.proc))
        self.servers[server.pid] = server
        self.restartable[server.pid] = (name, lambda: self._server_again(server, name), server.log_path)
        _say(f"started {name} (pid {server.pid}), log {server.log_path}")

    def _server_again(self, old: VLLMServerProcess, name: str) -> None:
        old.stop()  # it ended: its log closed, its leftovers (an ipc weight file) removed
        self.servers.pop(old.pid, None)
        server = VLLMServerProcess(old.spec, log_path=old.log_path, shares_with=old.shares_with)
        with _as_launch_error():
            server.start()
        self._watch_server(server, name)
        self._wait_healthy(server)

    def _wait_healthy(self, server: VLLMServerProcess) -> None:
        with _as_launch_error():  # it exited or never answered: the message has the end of its log
            server.wait_healthy(self.grpo.server_timeout, VLLMServerClient(server.spec.base_url).healthy,
                                Progress(f"starting vLLM on {server.spec.base_url}"))

    def _wait_registered(self) -> bool:
        """Environments may only register after the trainer has (a trainer's fresh start resets the run-api)."""
        class _Exited(Exception):
            pass

        def trainer_alive() -> None:
            if self.trainer.poll() is not None:
                raise _Exited

        def registered() -> bool:
            try:
                return int(requests.get(f"{self.settings.url}/info", timeout=2).json().get("batch_size", -1)) > 0
            except (requests.RequestException, ValueError):
                return False

        try:
            wait_until(registered, 1e9, Progress("waiting for the trainer to register with the run-api", every=30),
                       lambda _: "loading the model", ready="registered", check=trainer_alive, poll=1.0)
        except _Exited:
            _say(f"the trainer exited (code {self.trainer.returncode}) before registering with the run-api")
            return False
        return True

    def _watch(self, poll: float = 1.0) -> int:
        """Until the trainer ends: an environment that crashes ends the launch (with its log's end); the run-api
        or the server this launcher started is started again when it ends (up to MAX_RESTARTS times each; the
        trainer re-registers with a fresh run-api and waits for its server to come back, as after a user's
        restart)."""
        while self.trainer.poll() is None:
            envs = [(name, p) for name, p in self.procs if name.startswith("environment")]
            for i, (name, proc) in enumerate(envs):
                code = proc.poll()
                if code not in (None, 0):
                    log = self.logs / f"env_{i}.log"
                    raise LaunchError(f"{name} crashed (exit code {code}); the end of {log}:\n{_tail(log)}")
            for _, proc in list(self.procs):
                if proc.pid in self.restartable and proc.poll() is not None:
                    self._restart(proc)
            time.sleep(poll)
        return self.trainer.returncode

    def _restart(self, proc: subprocess.Popen) -> None:
        name, again, log = self.restartable.pop(proc.pid)
        done = self.restarts.get(name, 0)
        if done >= MAX_RESTARTS:
            raise LaunchError(f"{name} ended (exit code {proc.returncode}) and was already started again {done} "
                              f"times" + (f"; the end of {log}:\n{_tail(log)}" if log else ""))
        self.restarts[name] = done + 1
        _say(f"{name} (pid {proc.pid}) ended with exit code {proc.returncode}; starting it again "
             f"({done + 1}/{MAX_RESTARTS})" + (f"; the end of {log}:\n{_tail(log, 10)}" if log else ""))
        self.procs.remove((name, proc))
        again()

    def stop_all(self) -> None:
        """Stop everything we started, the trainer first, in reverse start order."""
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                _say(f"stopping {name} (pid {proc.pid})")
                if proc is self.trainer:  # let it save and stop its own children first
                    with_grace(proc, signal.SIGINT, 60)
            if proc.pid in self.servers:  # its workers too, its log closed, an ipc weight file removed
                self.servers.pop(proc.pid).stop(timeout=60)
            elif proc.poll() is None:
                stop_tree(proc, timeout=60)
        for fh in self._log_files:
            fh.close()


@contextlib.contextmanager
def _as_launch_error():
    """A server that cannot start (server/process.py's ServerStartError) ends the launch with its message."""
    try:
        yield
    except ServerStartError as exc:
        raise LaunchError(str(exc)) from None


def served(run: RunConfig) -> RunConfig:
    """The run as `axolotl vllm-serve` has it, for the server's spec: `bf16: auto` (the one dtype left unresolved:
    RunConfig.trainer_dtype None) resolved as axolotl resolves it (an ipc server holds the weights in the trainer's
    dtype). The server's address needs nothing filled in: an unset vllm.host / vllm.port is the default the plugin
    fills (config/defaults.py) in the spec too."""
    if run.trainer_dtype is not None:
        return run
    import torch  # here: only for `bf16: auto` (the launcher stays light otherwise)

    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return dataclasses.replace(run, trainer_dtype="bfloat16" if bf16 else "float32")


def with_grace(proc: subprocess.Popen, sig: int, timeout: float) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpo_plugin.atropos.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="the axolotl YAML (with a grpo.atropos block)")
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: extra arguments for axolotl train")
    args = ap.parse_args(argv)
    path = Path(args.config)
    try:
        run = run_config(yaml.safe_load(path.read_text()))
        if run.grpo.atropos is None:
            raise LaunchError(f"{path} has no grpo.atropos block (see docs/atropos.md)")
    except (OSError, yaml.YAMLError, ValueError, LaunchError) as exc:
        _say(f"ERROR: {exc}")
        return 2
    # the first `--` ends the launcher's arguments; a later one is axolotl's (`--launcher accelerate -- ...`)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    launch = Launch(path, run, train_args)

    def _terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    code = 1
    try:
        code = launch.run()
    except LaunchError as exc:
        _say(f"ERROR: {exc}")
    except KeyboardInterrupt:
        _say("interrupted: stopping everything this command started")
        code = 130
    finally:
        launch.stop_all()
    _say(f"done (exit code {code})")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
