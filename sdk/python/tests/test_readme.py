"""The Python example of the repository's README runs as written, against a real server."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[3] / "README.md"


def python_blocks(text: str) -> list:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_sdk_example_runs(corral_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [b for b in python_blocks(README.read_text()) if "import corral" in b]
    assert len(blocks) == 1, "the README has one SDK example"
    monkeypatch.setenv("CORRAL_URL", corral_url)
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], str(README), "exec"), {})
    printed = out.getvalue()
    assert "<table" in printed, printed  # df.describe() as HTML
    assert "data.csv" in printed, printed  # ls -la of the workspace
    assert printed.rstrip().endswith("42"), printed  # the one-shot run
    assert os.listdir(tmp_path) == [], "the example writes nothing locally"
