"""Planning a job's tests, in the fork server (standard library only: it runs inside the jail). Once per distinct
program or test, and only after the templates are forked (`ast` is imported here: ~0.5 MB that no forked process
carries): the program compiled, the names it imports at module level, each test compiled with the names it uses only
as modules, and the one call of a test that is nothing but `assert NAME(literals) == literal` (sent ahead,
judge_link.Program.send_ahead). A batch repeats its programs and tests: each is done once and kept (bounded)."""

from __future__ import annotations

import ast
import warnings


class Plans:
    """The programs, tests and imports worked out so far, each kept for the next job that repeats it."""

    MOST = {"programs": 4096, "tests": 16384, "imports": 4096}

    def __init__(self):
        self.kept: dict[str, dict] = {kind: {} for kind in self.MOST}

    def _get(self, kind: str, key: str, make):
        kept = self.kept[kind]
        if key in kept:
            return kept[key]
        if len(kept) > self.MOST[kind]:
            kept.clear()
        value = kept[key] = make(key)
        return value

    def program(self, source: str):
        """The program compiled, or the name of what compiling it raised."""
        return self._get("programs", source, _compile_program)

    def test(self, source: str):
        """A test compiled (compile_test), or None when it does not parse."""
        return self._get("tests", source, _compile_test_or_none)

    def imports(self, source: str) -> dict:
        return self._get("imports", source, program_imports)


def _compile_program(source: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return compile(source, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return type(exc).__name__


def _compile_test_or_none(source: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return compile_test(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


# ---- names a test reads -------------------------------------------------------------------------------------
def program_imports(source: str) -> dict[str, tuple[str, str | None]]:
    """Names the program binds by an import at module level (its top-level statements, and those nested in a
    top-level `if`, `try` or `with`), read from its syntax tree: name -> (module, attribute or None). An import
    written in a string or a comment is no import."""
    out: dict[str, tuple[str, str | None]] = {}
    try:
        body = list(ast.parse(source).body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return out
    while body:
        node = body.pop(0)
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = (a.name, None)
                else:
                    top = a.name.partition(".")[0]
                    out[top] = (top, None)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            nested = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                nested += handler.body
            body[:0] = nested
    return out


def compile_test(src: str) -> tuple:
    """(code, the names the test reads only as `name.attribute`, its call (`call_of`)): done once per distinct
    test, in the server."""
    tree = ast.parse(src)
    modules, _ = _module_uses(tree)
    return compile(tree, "<test>", "exec", dont_inherit=True), sorted(modules), call_of(tree)


def call_of(tree):
    """The one call a test makes when it is nothing but `assert NAME(literals) == literal` (or `!=`, `is`,
    `is not`; or `assert NAME(literals)`, `assert not NAME(literals)`; a message only when it is a literal):
    (NAME, args, kwargs) with the literals' values, else None. Such a test does nothing else to the program
    before or after that call, so the call can be sent ahead of the test (Program.send_ahead)."""
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    node = tree.body[0]
    if node.msg is not None and not isinstance(node.msg, ast.Constant):
        return None
    test = node.test
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    elif isinstance(test, ast.Compare):
        if len(test.ops) != 1 or not isinstance(test.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
            return None
        try:
            ast.literal_eval(test.comparators[0])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        test = test.left
    if not isinstance(test, ast.Call) or not isinstance(test.func, ast.Name):
        return None
    try:
        args = [ast.literal_eval(a) for a in test.args]  # a starred argument is no literal: refused here
        kwargs = {}
        for k in test.keywords:
            if k.arg is None:
                return None
            kwargs[k.arg] = ast.literal_eval(k.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return test.func.id, args, kwargs


def _module_uses(tree) -> tuple[set[str], set[str]]:
    """(names the test reads only as `name.attribute`, names it reads otherwise)."""
    as_module, other = set(), set()
    attr_bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            (as_module if id(n) in attr_bases else other).add(n.id)
    return as_module - other, other
