"""A data-analysis agent loop on Corral: a model answers a question about a CSV by calling
tools that run in a Corral sandbox.

    corral serve &                                   # the sandbox server (loopback: no key)
    pip install ./sdk/python                         # the `corral` Python SDK
    python examples/agent/agent.py                   # scripted model: no network, no key
    OPENAI_API_KEY=sk-... python examples/agent/agent.py   # a real model (`pip install openai`)

The tool definitions are the OpenAI-style schemas printed by `corral tools --format openai`
(the same schemas `corral mcp` serves); each tool call runs in one `corral.Sandbox` session,
so variables persist across calls. The CSV (`id,name,age,city,salary`) is generated here,
uploaded with `files.write`, and the question is "which city has the highest average salary?".

Environment: CORRAL_URL / CORRAL_API_KEY (the SDK's defaults: http://127.0.0.1:8420, no key),
CORRAL_BIN (the corral binary for `corral tools`; default `corral` on PATH), OPENAI_API_KEY,
OPENAI_BASE_URL (any OpenAI-compatible API) and OPENAI_MODEL (default gpt-4o-mini).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

QUESTION = "Which city has the highest average salary?"
CSV_NAME = "employees.csv"
CITIES = {"Lisbon": 52_000, "Oslo": 71_000, "Lima": 38_000, "Osaka": 64_000, "Nairobi": 45_000}
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]

SYSTEM = (
    "You are a data analyst. Answer questions about the data by running Python in the "
    "sandbox with the tools you have. The data file is in the working directory. Finish with "
    "a short answer in plain text that names the result."
)


def make_csv(rows: int = 200, seed: int = 7) -> str:
    """`id,name,age,city,salary` rows; each city's salaries scatter around its own mean."""
    rng = random.Random(seed)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "name", "age", "city", "salary"])
    for i in range(1, rows + 1):
        city = rng.choice(sorted(CITIES))
        salary = round(rng.gauss(CITIES[city], 6_000))
        writer.writerow([i, rng.choice(NAMES), rng.randint(21, 65), city, salary])
    return out.getvalue()


def tool_schemas() -> List[Dict[str, Any]]:
    """The OpenAI-style definitions, from `corral tools --format openai`."""
    binary = os.environ.get("CORRAL_BIN") or shutil.which("corral")
    if not binary:
        sys.exit("agent: cannot find the corral binary: put it on PATH or set CORRAL_BIN")
    out = subprocess.run([binary, "tools", "--format", "openai"], check=True, capture_output=True)
    return json.loads(out.stdout)


def run_tool(sandbox: Any, name: str, args: Dict[str, Any]) -> str:
    """Carries out one tool call in `sandbox` and returns what the model reads."""
    try:
        if name == "run_code":
            ex = sandbox.run_code(args["code"], language=args.get("language"))
            parts = []
            if ex.stdout:
                parts.append(ex.stdout)
            if ex.stderr:
                parts.append("stderr:\n" + ex.stderr)
            for r in ex.results:
                if r.png:
                    parts.append("[a PNG image was produced]")
                elif r.text:
                    parts.append(r.text)
            if ex.error:
                parts.append(f"{ex.error.name}: {ex.error.value}\n{ex.error.traceback}")
            elif ex.status != "success":
                parts.append(ex.error_message or ex.status)
            return "\n".join(parts) or "(no output)"
        if name == "write_file":
            info = sandbox.files.write(args["path"], args["content"])
            return f"wrote /workspace/{info.path} ({info.size} bytes)"
        if name == "read_file":
            return sandbox.files.read(args["path"])
        if name == "list_files":
            files = sandbox.files.list(args.get("dir"))
            return "\n".join(f"{f.path}\t{f.size} bytes" for f in files) or "(no files)"
        return f"unknown tool {name}"
    except Exception as e:  # the model reads the failure and may try again
        return f"error: {e}"


class ScriptedModel:
    """A stand-in for a model: a fixed list of tool calls, then an answer taken from the last
    tool output (the way a model would read it). Needs no network."""

    def __init__(self) -> None:
        self.turn = 0

    def __call__(self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]]) -> Dict[str, Any]:
        self.turn += 1
        calls = {
            1: ("list_files", {}),
            2: ("run_code", {"code": f"import pandas as pd\ndf = pd.read_csv({CSV_NAME!r})\ndf.shape"}),
            3: (
                "run_code",
                {
                    "code": "means = df.groupby('city')['salary'].mean().sort_values(ascending=False)\n"
                    "print(means.round(0).to_string())\n"
                    "print('TOP:', means.index[0])"
                },
            ),
        }
        if self.turn in calls:
            name, args = calls[self.turn]
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{self.turn}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
        last = next(m["content"] for m in reversed(messages) if m["role"] == "tool")
        top = next(line.split(":", 1)[1].strip() for line in last.splitlines() if line.startswith("TOP:"))
        return {"role": "assistant", "content": f"{top} has the highest average salary."}


class OpenAIModel:
    """A real model through the `openai` package (any OpenAI-compatible API)."""

    def __init__(self) -> None:
        from openai import OpenAI  # imported only when used

        self.client = OpenAI()
        self.model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")

    def __call__(self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]]) -> Dict[str, Any]:
        reply = self.client.chat.completions.create(model=self.model, messages=messages, tools=tools)
        return reply.choices[0].message.model_dump(exclude_none=True)


def agent_loop(sandbox: Any, model: Any, tools: List[Dict[str, Any]], max_turns: int = 10) -> str:
    messages: List[Dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{QUESTION} The data is in {CSV_NAME}."},
    ]
    for _ in range(max_turns):
        message = model(messages, tools)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return message.get("content") or ""
        for call in calls:
            name = call["function"]["name"]
            args = json.loads(call["function"]["arguments"] or "{}")
            output = run_tool(sandbox, name, args)
            print(f"-> {name}({json.dumps(args)[:200]})\n{output}\n", file=sys.stderr)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return "(no answer within the turn limit)"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["auto", "scripted", "openai"], default="auto",
                        help="auto: openai when OPENAI_API_KEY is set and the package is installed")
    parser.add_argument("--save-csv", type=Path, help="also write the generated CSV here")
    args = parser.parse_args(argv)

    from corral import Sandbox  # the SDK: pip install ./sdk/python

    kind = args.model
    if kind == "auto":
        try:
            import openai  # noqa: F401

            kind = "openai" if os.environ.get("OPENAI_API_KEY") else "scripted"
        except ImportError:
            kind = "scripted"
    model = OpenAIModel() if kind == "openai" else ScriptedModel()

    data = make_csv()
    if args.save_csv:
        args.save_csv.write_text(data)
    tools = tool_schemas()
    with Sandbox(os.environ.get("CORRAL_URL"), os.environ.get("CORRAL_API_KEY")) as sandbox:
        sandbox.files.write(CSV_NAME, data)
        answer = agent_loop(sandbox, model, tools)
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
