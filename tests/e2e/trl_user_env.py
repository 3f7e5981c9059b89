"""An environment and a reward written from TRL 1.14's documented contracts alone (the `GRPOTrainer` docstring:
`environment_factory`, `reset(**row)`, reward functions taking `environments`), used by tests/e2e/test_tool_train.py:

- `Store`: `reset` needs its row's own `secret` column (a bare `reset(prompt)` would not run), its `lookup()` method
  returns it;
- `looked`: TRL's usual environment reward, `def reward_func(environments, **kwargs)`: 1 for a rollout whose own
  instance was looked up, 0 otherwise. It refuses a private key of the plugin among its keywords (the run then
  stops with its error): a TRL reward function is given TRL's keywords, the dataset's columns and the rollout
  function's documented fields, nothing else.
"""

from __future__ import annotations


class Store:
    """A row's stored digit: from its `secret` column."""

    def reset(self, secret, prompt=None, **row):
        if secret is None:
            raise ValueError("Store.reset: this row has no secret")
        self.secret, self.looked = str(secret), False

    def lookup(self) -> str:
        """Look up the number to answer with.

        Returns:
            One digit.
        """
        self.looked = True
        return self.secret


def looked(environments, **kwargs) -> list[float]:
    """1.0 when the rollout's own environment instance was looked up (Vault's or Store's lookup ran)."""
    unexpected = [k for k in kwargs if k.startswith("_") or k == "environment_reward"]
    if unexpected:
        raise TypeError(f"looked() got keywords a TRL reward function is not given: {sorted(unexpected)}")
    return [1.0 if getattr(env, "looked", False) else 0.0 for env in environments]
