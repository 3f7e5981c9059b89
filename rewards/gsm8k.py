"""GSM8K: the dataset transform and reward functions, by import path.

    datasets:
      - path: ./data/gsm8k/train.jsonl        # rows {"question": ..., "answer": "... #### 72"}
        ds_type: json
        split: train
        type: rewards.gsm8k_transform          # NOT rewards.gsm8k.gsm8k_transform: see docs/rewards.md
    trl:
      reward_funcs: [rewards.gsm8k.accuracy_reward, rewards.gsm8k.format_reward]
      reward_weights: [1.0, 0.2]

- `gsm8k_transform` turns a row into a chat prompt (system instruction + question) and the ground-truth number
  parsed from the `#### N` line (column `answer`, which TRL passes to the reward functions).
- `accuracy_reward(completions, answer, **kwargs)`: 1.0 if the completion's final answer equals the ground truth
  in value, else 0.0. Plain-string and chat-format completions. Never raises: odd input scores 0.0.
- `format_reward(completions, **kwargs)`: 1.0 if the last non-empty line is `#### <number>` (what the system
  prompt asks for), 0.5 if the answer is marked another recognised way, else 0.0.

Everything here is safe in axolotl's reward worker processes and in threads: math-verify (used only for LaTeX
answers the plain parser cannot read) is called with its `signal.alarm` timeouts off, on short strings only.
"""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_plugin.codedata.extract import completion_text  # one reading of completions for every reward

SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step. On the last line, write the final answer as "
    "a plain number in the form `#### <number>`."
)

# A number as people write it: optional sign, thousands separators, decimals, or a simple fraction.
_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+"
_NUM_RE = re.compile(_NUM)
_FRAC_TEX = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_LATEX_CMD = re.compile(r"\\(?!frac|dfrac|tfrac|text|mathrm|\$|%|,|!)[a-zA-Z]+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"(?:final\s+answer|the\s+answer)\s*(?:is|:|=)\s*:?\s*([^\n]*)", re.IGNORECASE)
_LAST_LINE_FORMAT = re.compile(rf"^####\s*\$?\s*(?:{_NUM})\s*\.?\s*$")
_MAX_CHARS = 20_000  # only the tail of very long completions is read (the answer is at the end)
_MAX_SPAN = 200  # spans handed to math-verify are short: bounded time without signal.alarm


# ---- dataset transform ------------------------------------------------------------------------------
def gold_answer(solution: str) -> str:
    """The ground truth of a GSM8K solution: the text after the last `####`, normalised ("1,000" -> "1000")."""
    if "####" not in solution:
        raise ValueError(f"GSM8K answer without a '#### N' line: {solution[-80:]!r}")
    value = parse_number(solution.rsplit("####", 1)[1])
    if value is None:
        raise ValueError(f"GSM8K answer whose '#### N' is not a number: {solution[-80:]!r}")
    return format_number(value)


def gsm8k_transform(cfg=None, dataset_idx: int = 0, **kwargs):
    """axolotl dataset-transform factory (`type: rewards.gsm8k_transform`): question -> chat prompt,
    answer -> the ground-truth number."""
    system = SYSTEM_PROMPT
    if cfg is not None:
        ds_cfg = (cfg.get("datasets") or [{}])[dataset_idx] if hasattr(cfg, "get") else {}
        system = (ds_cfg or {}).get("system_prompt") or system

    def transform(example, tokenizer=None):
        return {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": example["question"]}],
            "answer": gold_answer(example["answer"]),
        }

    return transform, {"remove_columns": ["question"]}


# ---- answer extraction --------------------------------------------------------------------------------
def _boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (nested braces allowed)."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = text.find("{", start)
        if i != -1:
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1:j]
                j += 1
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_answer(text: str) -> str | None:
    """The span holding the final answer, by the first marker found in this order: `<answer>` tags,
    `\\boxed{}`, `####`, "the answer is"; else None (callers fall back to the last number)."""
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1]
    boxed = _boxed(text)
    if boxed is not None:
        return boxed
    hashes = _HASHES.findall(text)
    if hashes:
        return hashes[-1]
    said = _ANSWER_IS.findall(text)
    if said:
        return said[-1]
    return None


def parse_number(span: str) -> Fraction | None:
    """The value of the first number in `span`: "$1,234.50" -> 1234.5, "3/4" -> 3/4, "\\frac{3}{4}" -> 3/4,
    "72 clips." -> 72; None if there is none."""
    if not span:
        return None
    s = span.replace("\u2212", "-").replace("\u2013", "-").replace("\\!", "").replace("\\,", "")
    s = _FRAC_TEX.sub(lambda m: f"{m.group(1)}/{m.group(2)}", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    m = _NUM_RE.search(s)
    if not m:
        return None
    token = m.group(0).replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return Fraction(num) / Fraction(den) if Fraction(den) != 0 else None
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def format_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    if Fraction(as_float).limit_denominator(10**6) == value:
        return str(as_float)
    return f"{value.numerator}/{value.denominator}"


def predicted_value(text: str, span: str | None) -> Fraction | None:
    """The value of the marked answer span, else of the last number in the text."""
    if span is not None:
        return parse_number(span)
    numbers = _NUM_RE.findall(text.replace("\u2212", "-"))
    return parse_number(numbers[-1]) if numbers else None


def _math_verify_equal(gold: str, span: str) -> bool:
    """math-verify on a short LaTeX span, with its signal.alarm timeouts off (safe in threads and workers)."""
    try:
        import logging

        from math_verify import parse, verify

        logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call with timeouts off
        pred = parse(f"${span[:_MAX_SPAN]}$", parsing_timeout=None)
        return bool(pred) and bool(verify(parse(gold, parsing_timeout=None), pred, timeout_seconds=None))
    except Exception:
        return False


def score(completion, gold) -> float:
    """1.0 if the completion's final answer equals `gold` in value; 0.0 otherwise, and on any odd input."""
    try:
        text = completion_text(completion)
        gold_value = parse_number(gold.rsplit("####", 1)[-1] if isinstance(gold, str) else str(gold))
        if not text or gold_value is None:
            return 0.0
        text = text[-_MAX_CHARS:]
        span = extract_answer(text)  # once: both the plain parse and the math-verify fallback read it
        if predicted_value(text, span) == gold_value:
            return 1.0
        if span and (_LATEX_CMD.search(_FRAC_TEX.sub("", span)) or any(ch in span for ch in "^{}")):
            # LaTeX beyond \frac (\sqrt, powers, ...): ask math-verify
            return 1.0 if _math_verify_equal(format_number(gold_value), span) else 0.0
        return 0.0
    except Exception:
        return 0.0


# ---- reward functions (TRL signature) -------------------------------------------------------------------
def accuracy_reward(completions, answer=None, **kwargs) -> list[float]:
    """1.0 per completion whose final answer equals the ground truth (`answer` column) in value, else 0.0."""
    golds = answer if isinstance(answer, (list, tuple)) else [answer] * len(completions)
    return [score(c, g) for c, g in zip(completions, golds)]


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 if the last non-empty line is `#### <number>`; 0.5 if the answer is marked otherwise (`\\boxed{}`,
    `<answer>` tags, "the answer is"); else 0.0."""
    out = []
    for c in completions:
        try:
            text = completion_text(c)[-_MAX_CHARS:]
            lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
            if lines and _LAST_LINE_FORMAT.match(lines[-1]):
                out.append(1.0)
            elif extract_answer(text) is not None:
                out.append(0.5)
            else:
                out.append(0.0)
        except Exception:
            out.append(0.0)
    return out
