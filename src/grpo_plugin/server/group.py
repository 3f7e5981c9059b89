"""Several vLLM servers behind the one client interface the trainer, producers and sync modes already use.

`grpo.num_servers: N` (N servers on consecutive ports, started by `axolotl train` or `axolotl vllm-serve`) or
`grpo.server_urls: [...]` (servers started elsewhere) give the trainer a `ServerGroup` instead of one
`VLLMServerClient`:

- `generate` splits the prompts by whole prompt (one prompt = one GRPO group of `n` samples, so a group's shared
  prefix stays on one server's prefix cache) into contiguous shares, one per server, sends them in parallel and
  returns them in the prompts' order; every completion says which server sampled it (`Completion.server`). The
  share that gets the remainder rotates, so small batches spread over the servers too.
- every weight-sync call (adapter load/unload, `/collective_rpc`, prefix-cache reset, pause/resume, the policy
  version) goes to ALL servers in parallel; it succeeds only when it succeeded on every one (the first failure is
  raised, naming its server, after all have answered).
- what describes the served model is asked of every server and must agree.
- `healthy()` is true when every server answers.

The post-sync probe asks each server separately (`replicas`, sync/verify.py): a push counts as verified only
when every server computes with the trainer's weights. Recovery (server/recovery.py) brings back only the server
that was lost.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from grpo_plugin.server.client import Completion, ServerError, VLLMServerClient, in_daemon_thread


def shares(n_prompts: int, n_servers: int, offset: int = 0) -> list[range]:
    """Contiguous prompt ranges, one per server (`n_servers` ranges, some empty when there are fewer prompts than
    servers): sizes differ by at most one, and the servers that get one more are the `n_prompts % n_servers`
    starting at `offset` (mod n_servers)."""
    if n_servers < 1:
        raise ValueError("at least one server")
    base, extra = divmod(n_prompts, n_servers)
    bonus = {(offset + i) % n_servers for i in range(extra)}
    out, start = [], 0
    for s in range(n_servers):
        size = base + (1 if s in bonus else 0)
        out.append(range(start, start + size))
        start += size
    return out


def replicas_of(client) -> list:
    """The single-server clients behind `client` (itself when it is one)."""
    return list(getattr(client, "replicas", None) or [client])


class ServerGroup:
    def __init__(self, clients: list[VLLMServerClient]):
        if len(clients) < 2:
            raise ValueError("a ServerGroup is for two or more servers; use the client itself for one")
        urls = [c.base_url for c in clients]
        if len(set(urls)) != len(urls):
            raise ValueError(f"the same server is listed twice: {urls}")
        self.replicas = list(clients)
        self.timeout = clients[0].timeout
        self._turn = 0  # which server gets the first extra prompt of the next generate()

    @property
    def base_url(self) -> str:
        """For messages: every server's URL."""
        return ", ".join(c.base_url for c in self.replicas)

    @property
    def urls(self) -> list[str]:
        return [c.base_url for c in self.replicas]

    @property
    def watch(self) -> Callable[[], str | None] | None:
        return self.replicas[0].watch

    @watch.setter
    def watch(self, fn: Callable[[], str | None] | None) -> None:
        for c in self.replicas:
            c.watch = fn

    def fork(self) -> ServerGroup:
        """The same servers on new HTTP sessions (for another thread)."""
        return ServerGroup([c.fork() for c in self.replicas])

    # -- fan-out --------------------------------------------------------------------------------
    def each(self, call: Callable[[VLLMServerClient], Any]) -> list[Any]:
        """`call(client)` on every server in parallel; the results in server order."""
        return self._run([(c, functools.partial(call, c)) for c in self.replicas])

    @staticmethod
    def _run(jobs: list[tuple[VLLMServerClient, Callable[[], Any]]]) -> list[Any]:
        """Each job's call in its own thread; the results in job order. Waits for every job before raising the first
        failure, named with its server (a push half-done on one server is never left running unseen). A thread per
        call, not a pool: a call's liveness watch (server/recovery.py) fans out again while the call waits."""
        futures = [in_daemon_thread(fn) for _, fn in jobs]
        results, first = [], None
        for (client, _), future in zip(jobs, futures):
            try:
                results.append(future.result())
            except Exception as exc:
                results.append(None)
                if first is None:
                    first = (client, exc)
        if first is not None:
            client, exc = first
            if isinstance(exc, ServerError) and client.base_url not in str(exc):
                raise type(exc)(f"[server {client.base_url}] {exc}") from exc
            raise exc
        return results

    def _same(self, what: str, values: list[Any]) -> Any:
        if any(v != values[0] for v in values[1:]):
            detail = "; ".join(f"{u}: {v!r}" for u, v in zip(self.urls, values))
            raise ServerError(f"the vLLM servers disagree on {what}: {detail}. Start every server from the same "
                              "config (`axolotl vllm-serve <config.yaml>`).")
        return values[0]

    # -- health / models ------------------------------------------------------------------------
    def healthy(self) -> bool:
        return all(self.each(lambda c: c.healthy()))

    def models(self) -> list[str]:
        return self._same("the models they serve", [sorted(m) for m in self.each(lambda c: c.models())])

    def base_model(self) -> str:
        return self._same("the served base model", self.each(lambda c: c.base_model()))

    def server_info(self) -> dict:
        return self.replicas[0].server_info()

    def worker_extension(self) -> str | None:
        return self._same("the worker extension", self.each(lambda c: c.worker_extension()))

    # -- generation -----------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], **kwargs) -> list[list[Completion]]:
        """Each prompt's `n` completions, in the prompts' order; the prompts split by whole prompt over the
        servers (see the module docstring)."""
        ranges = shares(len(prompts), len(self.replicas), self._turn)
        self._turn = (self._turn + len(prompts)) % len(self.replicas)
        busy = [(i, r) for i, r in enumerate(ranges) if len(r)]

        seeds = kwargs.pop("seeds", None)  # one per prompt: each goes with its prompt

        def share(i: int, r: range) -> list[list[Completion]]:
            mine = {} if seeds is None else {"seeds": [seeds[k] for k in r]}
            groups = self.replicas[i].generate([prompts[k] for k in r], **kwargs, **mine)
            for group in groups:
                for c in group:
                    c.server = i
            return groups

        per_server = self._run([(self.replicas[i], functools.partial(share, i, r)) for i, r in busy])
        return [group for groups in per_server for group in groups]

    def prompt_logprobs(self, token_ids: list[int], *, model: str) -> list[float]:
        raise TypeError("ServerGroup.prompt_logprobs: ask each server (`replicas`); the probe verifies every one")

    # -- weight sync: every server --------------------------------------------------------------
    def load_lora_adapter(self, name: str, path: str, *, inplace: bool = False) -> None:
        self.each(lambda c: c.load_lora_adapter(name, path, inplace=inplace))

    def unload_lora_adapter(self, name: str, *, timeout: float | None = None) -> None:
        self.each(lambda c: c.unload_lora_adapter(name, timeout=timeout))

    def reset_prefix_cache(self) -> None:
        self.each(lambda c: c.reset_prefix_cache())

    def pause(self, *, mode: str = "wait", clear_cache: bool = True) -> None:
        self.each(lambda c: c.pause(mode=mode, clear_cache=clear_cache))

    def interrupt(self) -> None:
        self.each(lambda c: c.interrupt())

    def resume(self) -> None:
        self.each(lambda c: c.resume())

    def set_policy(self, version: int, model: str | None) -> None:
        self.each(lambda c: c.set_policy(version, model))

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None,
                       timeout: float | None = None, paths: dict[str, str] | None = None) -> list[Any]:
        """Every worker of every server: one result per worker, server after server."""
        per_server = self.each(lambda c: c.collective_rpc(method, kwargs, timeout=timeout, paths=paths))
        return [r for results in per_server for r in results]
