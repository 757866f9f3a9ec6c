"""The code base's shape: small modules (docs/layout.md); the layers themselves are held by the
import-linter contracts in pyproject.toml, which `make test` runs."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def test_no_module_is_over_400_lines():
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text().splitlines())
        for package in ("bench", "parallel_kernels")
        for p in (REPO / package).rglob("*.py")
    }
    assert len(sizes) > 40
    assert {k: v for k, v in sizes.items() if v > MAX_LINES} == {}
