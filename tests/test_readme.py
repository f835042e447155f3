"""The README is a front door: short, its links alive, every figure linked to the results
file it comes from and found there, and its test command the one CI runs."""

from __future__ import annotations

import re

from tests.conftest import ROOT

README = ROOT / "README.md"
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
FIGURE = re.compile(r"\b\d+(?:\.\d+)?x\b|\b\d+ of \d+\b")
TEST_COMMAND = ("pip install -e '.[dev]' && pytest -q -n 2 --dist loadfile -m 'not timing' "
                "&& pytest -q -m timing")


def local_links(text: str) -> list[tuple[str, str]]:
    return [(label, target) for label, target in LINK.findall(text)
            if not target.startswith(("http://", "https://", "#"))]


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 150


def test_every_local_link_of_the_readme_exists() -> None:
    for _, target in local_links(README.read_text()):
        assert (ROOT / target.split("#")[0]).exists(), target


def figures_outside_links(line: str) -> list[str]:
    return FIGURE.findall(LINK.sub("", line))


def test_every_figure_of_the_readme_links_to_the_file_that_holds_it() -> None:
    text = README.read_text()
    results = text.split("## Headline results")[1].split("\n## ")[0]
    rows = [line for line in results.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 6  # the header and the figures
    for row in rows[1:]:
        assert not figures_outside_links(row), row
        links = local_links(row)
        assert links, row
        for label, target in links:
            assert target.startswith("bench/results/"), (row, target)
            source = (ROOT / target).read_text()
            for figure in FIGURE.findall(label):
                number = figure.removesuffix("x").split(" of ")[0]
                assert number in source, f"{figure} not in {target}"


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    assert TEST_COMMAND in README.read_text()
    assert f"\n{TEST_COMMAND}\n" in (ROOT / ".ci" / "run").read_text()
