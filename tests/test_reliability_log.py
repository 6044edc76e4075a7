"""tests/reliability_log.py: the lines docs/reliability.md is built from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reliability_log import ENV, Tally, record


def test_nothing_is_written_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    record("a fault", 3)
    assert list(tmp_path.iterdir()) == []


def test_lines_are_appended_and_a_failed_tally_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "reliability.jsonl"
    monkeypatch.setenv(ENV, str(log))
    record("a fault", 3, hung=1)
    with pytest.raises(AssertionError), Tally("another fault") as tally:
        tally.cases += 2
        raise AssertionError("lost a write")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(d["fault_class"], d["cases"], d["hung"]) for d in lines] == [
        ("a fault", 3, 1),
        ("another fault", 2, 0),
    ]
    assert "failed" not in lines[0]
    assert lines[1]["failed"] is True
    assert lines[0]["test"].endswith("test_lines_are_appended_and_a_failed_tally_says_so")
