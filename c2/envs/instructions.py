"""Short task instructions (docs/recipe.md §3: a median of 390 characters), worded by seed."""

from __future__ import annotations

import random

_NUMBERS = {2: "Two", 3: "Three", 4: "Four"}


def _pick(rng: random.Random, options: list[str]) -> str:
    return options[rng.randrange(len(options))]


def _about(variant) -> str:
    """The package's docstring as a first sentence of context."""
    doc = variant.files.get(f"{variant.package}/__init__.py", "").strip().strip('"').strip()
    return f"`{variant.package}`: {doc.rstrip('.')}. " if doc else ""


def repair_instruction(variant, mutations, fail_to_pass: list[str], rng: random.Random) -> str:
    """Describe the symptom (failing tests, where it shows), never the fix."""
    return _about(variant) + _repair_text(variant, mutations, fail_to_pass, rng)


def _repair_text(variant, mutations, fail_to_pass, rng) -> str:
    pkg = variant.package
    first = fail_to_pass[rng.randrange(len(fail_to_pass))]
    check = "Check with `python -m pytest -q`."
    if len(mutations) == 1:
        m = mutations[0]
        return _pick(
            rng,
            [
                f"`{m.function}` in the `{pkg}` package gives wrong results: the test `{first}` "
                f"fails. Find the bug and fix it in the package code; the tests are correct and "
                f"must not be edited. {check}",
                f"Bug report: since the last change, `{first}` fails. The regression is somewhere "
                f"in `{m.file}`. Please fix it without touching the tests. {check}",
                f"The `{pkg}` test suite is red ({len(fail_to_pass)} failing, e.g. `{first}`). "
                f"Track down the cause and repair the code so that every test passes. Do not "
                f"change the tests.",
            ],
        )
    n = _NUMBERS.get(len(mutations), str(len(mutations)))
    modules = sorted({m.file for m in mutations})
    return _pick(
        rng,
        [
            f"After a bad merge {len(fail_to_pass)} tests of `{pkg}` fail, for example `{first}`. "
            f"{n} separate bugs are involved, across {len(modules)} modules. Fix all of them; "
            f"the tests are correct and must stay as they are. {check}",
            f"Several behaviours of `{pkg}` regressed at once: `{first}` and "
            f"{len(fail_to_pass) - 1} other tests fail. The faults are spread over "
            f"{len(modules)} modules. Repair the package code (not the tests) until the whole "
            f"suite passes.",
        ],
    )


def feature_instruction(variant, detail: dict, rng: random.Random) -> str:
    fn, path = detail["function"], detail["file"]
    tail = _pick(
        rng,
        [
            "The tests under `tests/` show the expected behaviour; make them pass without editing "
            "them.",
            "Keep the signature. `python -m pytest -q` must pass; do not change the tests.",
        ],
    )
    about = _about(variant)
    return f"{about}Implement `{fn}` in `{path}`; it is only a stub. {detail['description']} {tail}"
