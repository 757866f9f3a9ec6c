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
