"""The model's chat format, for the tool-calling loop: a prompt rendered with its tools, a model turn parsed into
text and tool calls, and the tokens that put tool results in front of the model's next turn. Pure functions of the
tokenizer (its chat template and response parser, as transformers 5 and TRL use them).

Tool results enter the sequence as the chat template renders them, appended to the token ids the model produced
(never a re-tokenisation of the whole conversation): the tokens the model sampled stay the tokens trained on.
"""

from __future__ import annotations

import json

MALFORMED = "(malformed)"  # the tool name a call that could not be read is counted under
UNKNOWN = "(unknown)"  # ... and a call naming a tool the rollout does not have


class TurnParse:
    """One model turn read by the tokenizer's response parser: the assistant message, and its tool calls as
    (name, arguments) — or the reason a call could not be read (`malformed`), which the loop answers with an error
    the model sees."""

    __slots__ = ("message", "calls", "malformed")

    def __init__(self, message: dict, calls: list[tuple[str, dict]], malformed: str | None):
        self.message, self.calls, self.malformed = message, calls, malformed


def ensure_response_parser(tokenizer) -> None:
    """The tokenizer can read tool calls out of a model turn: its own response template or schema, else the one TRL
    knows for its chat template (Qwen, Llama 3, ...); else a ValueError saying what to do."""
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return
    try:
        from trl.chat_template_utils import add_response_schema  # optional on the legacy TRL
    except ImportError as exc:
        raise ValueError("grpo.tools / grpo.environment_factory: the tokenizer has no response parser "
                         "(`response_template`) and this TRL cannot add one: set it on the tokenizer") from exc
    try:
        add_response_schema(tokenizer)
    except ValueError as exc:
        raise ValueError(
            "grpo.tools / grpo.environment_factory: the tokenizer's chat template is not one TRL can parse tool "
            "calls for, and it has no `response_template` of its own: save one with the tokenizer "
            "(transformers' chat response parsing docs), or use a model family TRL knows (Qwen 2.5/3, Llama 3.1, "
            f"GPT-OSS, ...). ({exc})") from None


def render_prompt(tokenizer, messages: list[dict], tools: list | None,
                  template_kwargs: dict | None = None) -> list[int]:
    """The prompt's token ids: `messages` with the tool schemas the chat template shows the model."""
    ids = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=True,
                                        return_dict=False, **(template_kwargs or {}))
    return list(ids)


def parse_turn(tokenizer, turn_ids: list[int], context_ids: list[int]) -> TurnParse:
    """The model's turn `turn_ids` (generated after `context_ids`) as a message and its tool calls."""
    try:
        message = tokenizer.parse_response(list(turn_ids), prefix=list(context_ids))
    except ValueError as exc:  # the parser's "could not parse region as JSON" and kin
        text = tokenizer.decode(list(turn_ids), skip_special_tokens=True)
        reason = " ".join(str(exc).split())[:120]
        return TurnParse({"role": "assistant", "content": text}, [], f"malformed tool call: {reason}")
    message = dict(message or {})
    message.setdefault("role", "assistant")
    calls, problems = [], []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", {}) if isinstance(function, dict) else None
        if isinstance(arguments, str):  # some templates carry the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            problems.append(f"malformed tool call (it needs a name and an arguments object): {json.dumps(call)[:80]}")
            continue
        calls.append((name, arguments))
    return TurnParse(message, calls, "; ".join(problems) or None)


def tool_suffix_ids(tokenizer, tool_messages: list[dict], template_kwargs: dict | None = None) -> list[int]:
    """The tokens between the end of the model's turn (its end-of-turn token) and its next turn: the tool results
    as the chat template frames them, then the template's opening of the next assistant turn.

    Rendered as the difference of one conversation with and without the tool messages (the template must render a
    message the same whatever follows it: checked, with an error naming the template otherwise)."""
    kwargs = dict(template_kwargs or {})
    call = {"type": "function", "function": {"name": tool_messages[0].get("name") or "tool", "arguments": {}}}
    head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    before = list(tokenizer.apply_chat_template(head, tokenize=True, return_dict=False, **kwargs))
    after = list(tokenizer.apply_chat_template(head + tool_messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=False, **kwargs))
    eos = tokenizer.eos_token_id
    ends = [i for i, t in enumerate(before) if t == eos]
    if ends:  # the model's turn ends at its end-of-turn token; what the template writes after it is the suffix's
        before = before[: ends[-1] + 1]
    if after[: len(before)] != before:
        raise ValueError("the chat template renders the assistant's tool-call turn differently once tool results "
                         "follow it, so tool results cannot be appended to the tokens the model sampled: use a "
                         "prefix-preserving template (TRL's get_training_chat_template gives one for known families)")
    return after[len(before):]


def tool_message(name: str, result) -> dict:
    """A tool's result as the message the model reads (TRL's shape: text, or a list of content blocks as is)."""
    return {"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)}
