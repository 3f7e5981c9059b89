"""grpo_plugin: a GRPO trainer plugin for axolotl with verified weight sync to a vLLM server.

Listed in an axolotl YAML as `plugins: [grpo_plugin.GRPOPlugin]`.
"""

__version__ = "0.1.0"
__all__ = ["GRPOPlugin"]


def __getattr__(name):  # lazy: importing grpo_plugin.config must not import axolotl
    if name == "GRPOPlugin":
        from grpo_plugin.plugin import GRPOPlugin

        return GRPOPlugin
    raise AttributeError(name)
