"""Planning a job's tests, in the fork server (standard library only: it runs inside the jail). Once per distinct
program or test, and only after the templates are forked (`ast` is imported here: ~0.5 MB that no forked process
carries): the program compiled, the names it imports at module level, each test compiled with the names it uses only
as modules, and the one call of a test that is nothing but `assert NAME(literals) == literal` (judged in place,
judge.Judge.literal_test). A batch repeats its programs and tests: each is done once and kept (bounded)."""

from __future__ import annotations

import ast
import operator
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


_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not", ast.Lt: "<", ast.LtE: "<="}
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_NOT_A_LITERAL = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, ArithmeticError)


def call_of(tree):
    """The one call a test makes when it is nothing but `assert NAME(literals) == literal` (or `!=`, `is`,
    `is not`; `assert abs(NAME(literals) - literal) < literal` (or `<=`); `assert NAME(literals)`,
    `assert not NAME(literals)`; a message only when it is a literal): (NAME, args, kwargs, check) with the
    literals' values (`literal`), else None. Such a test does nothing else to the program before or after that
    call. `check`, what the test asks of the call's
    value, for the judge to ask it without running the test as code (judge.Judge.literal_test): (op, literal, None)
    with op `==`, `!=`, `is` or `is not` (`is` only with None, True or False), ("abs<", literal, bound) or
    ("abs<=", ...), ("truth", None, None) or ("not", None, None); None for an `is` with another literal (the test
    then runs as code)."""
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    node = tree.body[0]
    if node.msg is not None and not isinstance(node.msg, ast.Constant):
        return None
    test, check = node.test, ("truth", None, None)
    try:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, check = test.operand, ("not", None, None)
        elif isinstance(test, ast.Compare):
            op = _OPS.get(type(test.ops[0])) if len(test.ops) == 1 else None
            if op is None:
                return None
            want = literal(test.comparators[0])
            if op in ("<", "<="):  # only as a tolerance: abs(NAME(...) - literal) < bound
                left = test.left
                if not (isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "abs"
                        and len(left.args) == 1 and not left.keywords and isinstance(left.args[0], ast.BinOp)
                        and isinstance(left.args[0].op, ast.Sub)):
                    return None
                check = ("abs" + op, literal(left.args[0].right), want)
                test = left.args[0].left
            else:
                check = (op, want, None) if op in ("==", "!=") or want is None or type(want) is bool else None
                test = test.left
        if not isinstance(test, ast.Call) or not isinstance(test.func, ast.Name):
            return None
        args = [literal(a) for a in test.args]  # a starred argument is no literal: refused here
        kwargs = {}
        for k in test.keywords:
            if k.arg is None:
                return None
            kwargs[k.arg] = literal(k.value)
    except _NOT_A_LITERAL:
        return None
    return test.func.id, args, kwargs, check


def literal(node):
    """A test's literal value: what `ast.literal_eval` reads, and arithmetic on numbers in it (`2.0 / 3.0`,
    `(3 + 5, 3 * 5)`), folded here as CPython computes it (ints of at most 256 bits in, so nothing grows past what
    the source spells out). ValueError (or an ArithmeticError) for anything else."""
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        a, b = literal(node.left), literal(node.right)
        if not all(type(x) is float or type(x) is int and x.bit_length() <= 256 for x in (a, b)):
            return ast.literal_eval(node)  # (a complex number: `1 + 2j`)
        return _ARITHMETIC[type(node.op)](a, b)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and not isinstance(
            node.operand, ast.Constant):
        value = literal(node.operand)
        if type(value) not in (int, float):
            raise ValueError("a sign on something other than a number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and not all(isinstance(e, ast.Constant) for e in node.elts):
        values = [literal(e) for e in node.elts]
        return tuple(values) if isinstance(node, ast.Tuple) else values if isinstance(node, ast.List) else set(values)
    return ast.literal_eval(node)


def _module_uses(tree) -> tuple[set[str], set[str]]:
    """(names the test reads only as `name.attribute`, names it reads otherwise)."""
    as_module, other = set(), set()
    attr_bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            (as_module if id(n) in attr_bases else other).add(n.id)
    return as_module - other, other
