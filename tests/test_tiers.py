"""The suite's collection rules (tests/conftest.py): every test in exactly one tier, and a serial
test in a file that names its marker in full (``SERIAL``), which is how the Makefile's serial
pass finds the files it collects. (This file never spells the marker out: the pass would
collect it too.)"""

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import SERIAL, pytest_collection_modifyitems

pytestmark = pytest.mark.unit


class Item:
    """What the hook reads of a collected test: its file and its markers."""

    def __init__(self, path: Path, *marks: str) -> None:
        self.path = path
        self.nodeid = f"{path.name}::test"
        self.marks = [SimpleNamespace(name=m) for m in marks]

    def iter_markers(self):
        return iter(self.marks)

    def get_closest_marker(self, name: str):
        return next((m for m in self.marks if m.name == name), None)


def test_a_serial_test_is_collected_where_its_file_says_so(tmp_path):
    said = tmp_path / "test_said.py"
    said.write_text(f"import pytest\n\n@{SERIAL}\ndef test_a(): ...\n")
    aliased = tmp_path / "test_aliased.py"
    aliased.write_text("from pytest import mark\n\n@mark.serial\ndef test_b(): ...\n")
    items = [Item(aliased, "unit"), Item(said, "unit", "serial")]
    pytest_collection_modifyitems(None, items)
    assert [i.path for i in items] == [aliased, said]  # the unit tier's files keep their order
    with pytest.raises(pytest.UsageError, match=r"must say .*test_aliased"):
        pytest_collection_modifyitems(None, [Item(aliased, "ranks", "serial")])


def test_a_test_in_no_tier_or_two_is_refused(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text("")
    for marks in ((), ("unit", "e2e")):
        with pytest.raises(pytest.UsageError, match="exactly one tier marker"):
            pytest_collection_modifyitems(None, [Item(path, *marks)])
