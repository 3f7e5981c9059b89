"""Test statements made strict before they run next to model-written code (pure functions; no sandbox needed).

`harden(test)` rewrites every `a == b` / `a != b` in which one side is a plain literal (a number, string, bytes,
bool, None, or a list / tuple / set / dict of such) into a call of the sandbox's strict comparison
(`__grpo_eq__(a, b)` / `__grpo_ne__(a, b)`, zygote.py): an object that merely *claims* equality (`__eq__` always
True, a str subclass that equals everything) no longer passes `assert f(x) == 5`. Comparisons between two
computed values are left alone (there is no plain value to hold them to).

`as_function(test)` wraps the hardened statement in a function whose parameters are the two helpers, so the test
reads them as locals: code under test cannot swap them out through the module's globals while the test runs.
"""

from __future__ import annotations

import ast

EQ, NE = "__grpo_eq__", "__grpo_ne__"
TEST_FN = "__grpo_test__"
_PLAIN_CONSTANTS = (int, float, complex, str, bytes, bool, type(None))


def is_plain_literal(node: ast.AST) -> bool:
    """A literal whose value is plain data (what `ast.literal_eval` accepts, containers included)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, _PLAIN_CONSTANTS)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float, complex))
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):  # complex literals: 1+2j
        return is_plain_literal(node.left) and is_plain_literal(node.right)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(is_plain_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and is_plain_literal(k) for k in node.keys) and all(
            is_plain_literal(v) for v in node.values)
    return False


class _Strict(ast.NodeTransformer):
    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        operands = [node.left, *node.comparators]
        parts = []
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if isinstance(op, (ast.Eq, ast.NotEq)) and (is_plain_literal(left) or is_plain_literal(right)):
                actual, expected = (right, left) if is_plain_literal(left) and not is_plain_literal(right) \
                    else (left, right)
                parts.append(ast.Call(func=ast.Name(EQ if isinstance(op, ast.Eq) else NE, ast.Load()),
                                      args=[actual, expected], keywords=[]))
            else:
                parts.append(ast.Compare(left=left, ops=[op], comparators=[right]))
        if len(parts) == 1:
            return parts[0]
        # a chain `a == 1 == b` evaluates each operand once in Python; the rewrite evaluates shared ones twice,
        # which only matters for operands with side effects (not seen in test cases)
        return ast.BoolOp(op=ast.And(), values=parts)


def harden(test: str) -> str:
    """The test with equality against plain literals made strict. Raises SyntaxError for a test that does not
    parse (the caller scores it 0 and says why)."""
    tree = ast.parse(test)
    tree = ast.fix_missing_locations(_Strict().visit(tree))
    return ast.unparse(tree)


def as_function(test: str) -> str:
    """`def __grpo_test__(__grpo_eq__, __grpo_ne__): <hardened test>`: the source the sandbox compiles."""
    body = harden(test)
    indented = "\n".join("    " + line for line in body.splitlines()) or "    pass"
    return f"def {TEST_FN}({EQ}, {NE}):\n{indented}\n"
