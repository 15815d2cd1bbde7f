"""AST bug injection in the manner of SWE-smith: every place a mutation operator applies to a
module, as a small text edit (so the rest of the file keeps its formatting and the fix is a
small diff).

Operators: operator swap, comparison swap, boolean swap, negated condition, off-by-one, wrong
constant, dropped branch, wrong variable, swapped arguments.
"""

from __future__ import annotations

import ast
import dataclasses
import random
from collections.abc import Iterator

KINDS = (
    "operator_swap",
    "comparison_swap",
    "boolean_swap",
    "negated_condition",
    "off_by_one",
    "wrong_constant",
    "dropped_branch",
    "wrong_variable",
    "swapped_arguments",
)
_BINOP = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
_BINOP_SWAP = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "/", "%": "//"}
_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_CMP_SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}


@dataclasses.dataclass(frozen=True)
class Mutation:
    """Replace source[start:end] (character offsets) with `new`."""

    kind: str
    file: str
    function: str  # the enclosing function ("Class.method" for methods)
    line: int
    start: int
    end: int
    new: str
    description: str

    def apply(self, source: str) -> str:
        return source[: self.start] + self.new + source[self.end :]

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("kind", "file", "function", "line", "description")}


def apply_all(source: str, mutations: list[Mutation]) -> str:
    """Apply non-overlapping mutations of one file (from the end, so offsets stay valid)."""
    ordered = sorted(mutations, key=lambda m: m.start, reverse=True)
    for a, b in zip(ordered, ordered[1:]):
        if b.end > a.start:
            raise ValueError(f"mutations overlap: {b.description!r} and {a.description!r}")
    for m in ordered:
        source = m.apply(source)
    return source


class _Offsets:
    """(line, utf-8 column) -> character offset."""

    def __init__(self, source: str):
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def __call__(self, line: int, col: int) -> int:
        text = self.lines[line - 1].encode()[:col].decode()
        return self.starts[line - 1] + len(text)


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", item


def _body_nodes(fn: ast.FunctionDef) -> Iterator[ast.AST]:
    """Nodes of a function body, skipping its docstring and nested definitions."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Lambda):
            continue
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _local_names(fn: ast.FunctionDef) -> list[str]:
    names = [a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
    for node in _body_nodes(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in names:
            names.append(node.id)
    return names


def mutation_sites(source: str, file: str) -> list[Mutation]:
    """Every mutation the operators can make in `source`, in a deterministic order."""
    tree = ast.parse(source)
    off = _Offsets(source)
    out: list[Mutation] = []

    def seg(node) -> tuple[int, int]:
        return off(node.lineno, node.col_offset), off(node.end_lineno, node.end_col_offset)

    def gap_op(left, right, symbol: str, new_symbol: str, kind, where, node, what):
        """Swap the operator written between two operands."""
        s, e = seg(left)[1], seg(right)[0]
        gap = source[s:e]
        idx = _find_symbol(gap, symbol)
        if idx is None:
            return
        out.append(
            Mutation(
                kind,
                file,
                where,
                node.lineno,
                s + idx,
                s + idx + len(symbol),
                new_symbol,
                f"{what}: `{symbol}` -> `{new_symbol}` in {where}",
            )
        )

    for where, fn in _functions(tree):
        locals_ = _local_names(fn)
        for node in _body_nodes(fn):
            if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
                sym = _BINOP[type(node.op)]
                gap_op(
                    node.left,
                    node.right,
                    sym,
                    _BINOP_SWAP[sym],
                    "operator_swap",
                    where,
                    node,
                    "operator swap",
                )
            elif isinstance(node, ast.Compare):
                left = node.left
                for op, right in zip(node.ops, node.comparators):
                    if type(op) in _CMP:
                        sym = _CMP[type(op)]
                        gap_op(
                            left,
                            right,
                            sym,
                            _CMP_SWAP[sym],
                            "comparison_swap",
                            where,
                            node,
                            "wrong comparison",
                        )
                    left = right
            elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
                sym, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
                gap_op(
                    node.values[0],
                    node.values[1],
                    sym,
                    new,
                    "boolean_swap",
                    where,
                    node,
                    "boolean swap",
                )
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                s, e = seg(node)
                inner = source[slice(*seg(node.operand))]
                out.append(
                    Mutation(
                        "negated_condition",
                        file,
                        where,
                        node.lineno,
                        s,
                        e,
                        inner,
                        f"negated condition: dropped `not` in {where}",
                    )
                )
            elif isinstance(node, ast.If):
                out.extend(_dropped_branches(node, source, off, file, where))
            elif isinstance(node, ast.Call) and len(node.args) >= 2 and not node.keywords:
                a, b = node.args[0], node.args[1]
                if not any(isinstance(x, ast.Starred) for x in (a, b)):
                    (sa, ea), (sb, eb) = seg(a), seg(b)
                    ta, tb = source[sa:ea], source[sb:eb]
                    if ta != tb:
                        new = tb + source[ea:sb] + ta
                        out.append(
                            Mutation(
                                "swapped_arguments",
                                file,
                                where,
                                node.lineno,
                                sa,
                                eb,
                                new,
                                f"swapped arguments {ta!r}, {tb!r} in {where}",
                            )
                        )
            if isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
                out.extend(_constant_mutations(node, off, file, where))
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in locals_:
                others = [n for n in locals_ if n != node.id]
                if others:
                    s, e = seg(node)
                    # The nearest other local (by position in the list) keeps the choice stable.
                    alt = others[(locals_.index(node.id)) % len(others)]
                    out.append(
                        Mutation(
                            "wrong_variable",
                            file,
                            where,
                            node.lineno,
                            s,
                            e,
                            alt,
                            f"wrong variable: `{node.id}` -> `{alt}` in {where}",
                        )
                    )
    return out


def _find_symbol(gap: str, symbol: str) -> int | None:
    """Index of the operator in the text between two operands (parentheses and spaces only)."""
    i = gap.find(symbol)
    while i != -1:
        before, after = gap[i - 1 : i], gap[i + len(symbol) : i + len(symbol) + 1]
        alpha = symbol.isalpha()
        if alpha and not (before.isalnum() or after.isalnum()):
            return i
        if not alpha and before not in "<>=!*/" and after not in "<>=*/":
            return i
        i = gap.find(symbol, i + 1)
    return None


def _constant_mutations(node: ast.Constant, off, file, where) -> list[Mutation]:
    s, e = off(node.lineno, node.col_offset), off(node.end_lineno, node.end_col_offset)
    v = node.value
    if isinstance(v, bool):
        new, kind = repr(not v), "wrong_constant"
    elif isinstance(v, int):
        return [
            Mutation(
                "off_by_one",
                file,
                where,
                node.lineno,
                s,
                e,
                str(v + d),
                f"off-by-one: {v} -> {v + d} in {where}",
            )
            for d in ((1, -1) if v > 0 else (1,))
        ]
    else:
        new, kind = repr(v * 2 if v else 1.0), "wrong_constant"
    return [
        Mutation(
            kind, file, where, node.lineno, s, e, new, f"wrong constant: {v!r} -> {new} in {where}"
        )
    ]


def _dropped_branches(node: ast.If, source, off, file, where) -> list[Mutation]:
    """Delete an `if` without else (a guard or a special case), or one `elif` branch."""
    lines = off.lines
    desc = f"dropped branch at line {{}} in {where}"
    if not node.orelse:
        first = lines[node.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        s, e = off.starts[node.lineno - 1], off.starts[node.end_lineno]
        # The block must keep a statement: leave `pass` where the `if` was.
        new = f"{indent}pass\n"
        return [
            Mutation(
                "dropped_branch", file, where, node.lineno, s, e, new, desc.format(node.lineno)
            )
        ]
    elif_ = node.orelse[0]
    if len(node.orelse) != 1 or not isinstance(elif_, ast.If):
        return []
    if not lines[elif_.lineno - 1].lstrip().startswith("elif"):
        return []
    # The branch runs from its `elif` line to the line before the next `elif`/`else` keyword.
    stop = elif_.end_lineno + 1
    if elif_.orelse:
        nxt = elif_.orelse[0].lineno
        stop = next(
            (
                n
                for n in range(nxt, elif_.body[-1].end_lineno, -1)
                if lines[n - 1].lstrip().startswith(("else", "elif"))
            ),
            None,
        )
        if stop is None:
            return []
    s, e = off.starts[elif_.lineno - 1], off.starts[stop - 1]
    return [
        Mutation("dropped_branch", file, where, elif_.lineno, s, e, "", desc.format(elif_.lineno))
    ]


def kind_balanced(by_kind: dict[str, list[Mutation]], rng: random.Random) -> list[Mutation]:
    """Candidates in random order with every operator kind equally likely at each draw
    (names are far more numerous than operators: uniform sites would mostly rename)."""
    pools = {k: list(v) for k, v in sorted(by_kind.items())}
    for v in pools.values():
        rng.shuffle(v)
    out = []
    while pools:
        kind = sorted(pools)[rng.randrange(len(pools))]
        out.append(pools[kind].pop())
        if not pools[kind]:
            del pools[kind]
    return out
