"""Reading code out of completions and test cases out of rows (pure functions; rewards/code.py and the dataset
check use them)."""

from __future__ import annotations

import ast
import json
import re

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
PYTHON_TAGS = ("python", "python3", "py")


def completion_text(completion) -> str:
    """The text of a completion: a string, or the last message of a chat-format completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)) and completion:
        return completion_text(completion[-1])
    return ""


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every closed ``` block, in order."""
    return [((m.group(1) or "").lower(), m.group(2)) for m in _FENCE.finditer(text)]


def extract_code(completion) -> str:
    """The last fenced ```python block (```py, or an untagged ``` block, when no python one exists), else the
    whole completion."""
    text = completion_text(completion)
    blocks = fenced_blocks(text)
    tagged = [body for tag, body in blocks if tag in PYTHON_TAGS]
    if tagged:
        return tagged[-1]
    untagged = [body for tag, body in blocks if not tag]
    return untagged[-1] if untagged else text


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def as_test_list(value) -> list[str] | None:
    """A row's test cases as a list of statements: a list/tuple of strings, or a JSON string of one; None when
    missing or malformed."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, str) and t.strip() for t in value):
        return list(value)
    return None
