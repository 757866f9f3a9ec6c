"""The code base's shape: small modules and functions (docs/layout.md); the layers themselves
are held by the import-linter contracts in pyproject.toml, which `make test` runs."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 400
MAX_FUNCTION_LINES = 60


def test_no_module_is_over_400_lines():
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text().splitlines())
        for package in ("bench", "parallel_kernels")
        for p in (REPO / package).rglob("*.py")
    }
    assert len(sizes) > 40
    assert {k: v for k, v in sizes.items() if v > MAX_LINES} == {}


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
