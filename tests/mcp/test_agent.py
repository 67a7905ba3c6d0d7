"""The example agent loop (examples/agent/agent.py) against a real `corral serve`, with its
scripted model turn: the tool schemas come from `corral tools --format openai`, the calls go
through the Python SDK, and the final answer must name the city with the highest average
salary (computed here from the same generated CSV)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from corral_testing import REPO, corral_bin, free_port

AGENT = REPO / "examples" / "agent" / "agent.py"


def top_city(path: Path) -> str:
    sums: dict = defaultdict(float)
    counts: dict = defaultdict(int)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            sums[row["city"]] += float(row["salary"])
            counts[row["city"]] += 1
    return max(sums, key=lambda c: sums[c] / counts[c])


def test_tools_schema_matches_mcp() -> None:
    out = subprocess.run([str(corral_bin()), "tools", "--format", "openai"], check=True, capture_output=True)
    tools = json.loads(out.stdout)
    assert [t["function"]["name"] for t in tools] == ["run_code", "write_file", "read_file", "list_files"]
    assert all(t["type"] == "function" for t in tools)
    assert tools[0]["function"]["parameters"]["required"] == ["code"]
    out = subprocess.run([str(corral_bin()), "tools", "--format", "anthropic"], check=True, capture_output=True)
    anthropic = json.loads(out.stdout)
    assert anthropic[0]["input_schema"] == tools[0]["function"]["parameters"]


def test_scripted_agent_finds_the_city(tmp_path: Path, start_listening: Any) -> None:
    port = free_port()
    start_listening(
        ["serve", "--listen", f"127.0.0.1:{port}", "--db", str(tmp_path / "c.db"), "--pool-size", "1"], port
    )
    env = dict(os.environ)
    env.update(
        CORRAL_URL=f"http://127.0.0.1:{port}",
        CORRAL_BIN=str(corral_bin()),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "sdk" / "python" / "src"), env.get("PYTHONPATH")])),
    )
    env.pop("CORRAL_API_KEY", None)
    env.pop("OPENAI_API_KEY", None)
    data = tmp_path / "employees.csv"
    run = subprocess.run(
        [sys.executable, str(AGENT), "--model", "scripted", "--save-csv", str(data)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    expected = top_city(data)
    answer = run.stdout.strip().splitlines()[-1]
    assert expected in answer, f"answer {answer!r} does not name {expected}\n{run.stderr}"
    # The model's calls ran in the sandbox: the tool outputs are logged on stderr.
    assert "-> run_code" in run.stderr and "TOP:" in run.stderr
