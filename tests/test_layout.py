"""The code base's shape: small functions (docs/layout.md); the layers themselves are held by
the import-linter contracts in pyproject.toml, which `make test` runs. A module is one idea,
however long: no line count is asked of a file (a count made files split by size, not by
meaning)."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60


def _sources():
    return [p for package in ("bench", "parallel_kernels") for p in (REPO / package).rglob("*.py")]


def test_no_function_is_over_60_lines_and_fmt_skip_stays_rare():
    long, skips = [], 0
    for path in _sources():
        text = path.read_text()
        skips += text.count("# fmt: skip")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} {lines}")
    assert long == []
    assert skips <= 40  # kept only where a table's alignment carries meaning


SHARED_BY_CONVENTION = ("__init__.py", "__main__.py", "conftest.py")  # names Python and pytest give


def test_no_two_modules_share_a_name_and_one_package_is_plan():
    """A module's name is found once in the tree, so that a name in a traceback, an import or
    a conversation means one file; ``plan`` is the planner's package alone."""
    names: dict[str, list[str]] = {}
    for package in ("bench", "parallel_kernels", "tests", "examples", "scripts"):
        for p in (REPO / package).rglob("*.py"):
            if p.name not in SHARED_BY_CONVENTION and ".venv" not in p.parts:
                names.setdefault(p.name, []).append(str(p.relative_to(REPO)))
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}
    plans = [
        p for p in (REPO / "bench").rglob("plan") if p.is_dir() and "__pycache__" not in str(p)
    ]
    assert [str(p.relative_to(REPO)) for p in plans] == ["bench/plan"]
