"""Documents live in the repository: no path outside it, and every recipe citation resolves."""

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).parent.parent


def tracked_text_files():
    names = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in names:
        if name.endswith((".py", ".md", ".ipynb", ".cfg", ".toml", ".txt")) or name == "Makefile":
            yield name, (ROOT / name).read_text(errors="replace")


OUTSIDE = "../" + "shared"  # spelled in two parts so this file does not match itself


def test_nothing_points_outside_the_repository():
    bad = [name for name, text in tracked_text_files() if OUTSIDE in text]
    assert not bad, f"these cite {OUTSIDE} (outside the repository): {bad}"


def test_recipe_citations_name_existing_sections():
    sections = set(re.findall(r"^## §(\d+)\.", (ROOT / "docs/recipe.md").read_text(), re.M))
    assert sections == {"0", "1", "2", "3", "4"}
    cited = {
        (name, m)
        for name, text in tracked_text_files()
        for m in re.findall(r"docs/recipe\.md\s+§(\d+)", text)
    }
    assert cited, "nothing cites docs/recipe.md by section"
    assert not [c for c in cited if c[1] not in sections], cited
