"""Mutation operators: each yields the expected small text edit; nothing outside functions."""

import ast

import pytest

from c2.envs.mutations import KINDS, apply_all, mutation_sites

SRC = '''"""Module docstring."""

LIMIT = 10


def f(a, b):
    """Docstring 1 + 2 stays."""
    total = a + b * 2
    if a < b and not b:
        return total
    if a == 0:
        raise ValueError("zero")
    return max(a, b) - LIMIT


def g(x):
    if x > 1:
        return "big"
    elif x > 0:
        return "small"
    else:
        return "none"


class C:
    def m(self, n):
        for i in range(n):
            if i % 2 == 0:
                return True
        return False
'''


def sites(kind):
    return [m for m in mutation_sites(SRC, "mod.py") if m.kind == kind]


def mutated_lines(m):
    old, new = SRC.splitlines(), m.apply(SRC).splitlines()
    return [b for a, b in zip(old, new) if a != b] if len(old) == len(new) else None


def test_every_site_parses_and_changes_code():
    all_sites = mutation_sites(SRC, "mod.py")
    assert {m.kind for m in all_sites} == set(KINDS)
    for m in all_sites:
        out = m.apply(SRC)
        assert out != SRC
        ast.parse(out)  # every mutant is valid Python
        assert m.function in ("f", "g", "C.m")
        assert "Docstring 1 + 2 stays." in out and "LIMIT = 10" in out


def test_operator_swap():
    got = {tuple(mutated_lines(m)) for m in sites("operator_swap")}
    assert ("    total = a - b * 2",) in got
    assert ("    total = a + b / 2",) in got
    assert ("    return max(a, b) + LIMIT",) in got
    assert ("            if i // 2 == 0:",) in got


def test_comparison_and_boolean_swaps():
    cmp = {tuple(mutated_lines(m)) for m in sites("comparison_swap")}
    assert ("    if a <= b and not b:",) in cmp and ("    if a != 0:",) in cmp
    assert ("    if x >= 1:",) in cmp
    boolean = [mutated_lines(m) for m in sites("boolean_swap")]
    assert boolean == [["    if a < b or not b:"]]
    neg = [mutated_lines(m) for m in sites("negated_condition")]
    assert neg == [["    if a < b and b:"]]


def test_off_by_one_and_wrong_constant():
    obo = {tuple(mutated_lines(m)) for m in sites("off_by_one")}
    assert ("    total = a + b * 3",) in obo and ("    total = a + b * 1",) in obo
    assert ("    if a == 1:",) in obo
    const = {tuple(mutated_lines(m)) for m in sites("wrong_constant")}
    assert ("                return False",) in const


def test_dropped_branch_guard_and_elif():
    outs = [m.apply(SRC) for m in sites("dropped_branch")]
    assert any(
        'raise ValueError("zero")' not in o and "    pass\n    return max" in o for o in outs
    )
    no_elif = [o for o in outs if "elif" not in o]
    assert len(no_elif) == 1
    assert 'return "big"\n    else:\n        return "none"' in no_elif[0]


def test_wrong_variable_and_swapped_arguments():
    wv = {tuple(mutated_lines(m)) for m in sites("wrong_variable")}
    assert ("    total = b + b * 2",) in wv
    sw = [mutated_lines(m) for m in sites("swapped_arguments")]
    assert ["    return max(b, a) - LIMIT"] in sw


def test_apply_all_combines_and_refuses_overlap():
    a = next(m for m in sites("operator_swap") if "LIMIT" in mutated_lines(m)[0])
    b = next(m for m in sites("comparison_swap") if mutated_lines(m) == ["    if x >= 1:"])
    out = apply_all(SRC, [a, b])
    assert "return max(a, b) + LIMIT" in out and "if x >= 1:" in out
    overlapping = [m for m in sites("wrong_variable") if m.line == a.line]
    with pytest.raises(ValueError, match="overlap"):
        apply_all(SRC, [a, *overlapping, *sites("swapped_arguments")])
