"""docs/e2b.md §12 stays true: every row of its table of SDK calls names, in its "checked by"
column, the tests of both suites that check it (`test_e2b_x.py::test_name` in tests/e2b,
`x.test.mjs::title` in tests/e2b-js/test), and every test it names exists and is not skipped.
A row whose JavaScript column is "—" (a call the JavaScript SDK does not have) needs only
Python tests."""

import re

from corral_testing import REPO

DOC = REPO / "docs" / "e2b.md"
PY_DIR = REPO / "tests" / "e2b"
JS_DIR = REPO / "tests" / "e2b-js" / "test"
STATUSES = ("supported", "differs", "not supported")
PY_REF = re.compile(r"^(test_\w+\.py)::(\w+)$")
JS_REF = re.compile(r"^([\w-]+\.test\.mjs)::(.+)$")
# `it('title'`, `it("title"` or `it(`title``, not `it.skip(`/`it.todo(` nor `split(`.
JS_IT = re.compile(r"(?<![\w.$])it\(\s*(['\"`])((?:\\.|(?!\1).)*)\1")


def split_row(line):
    """The cells of a table row: `|` splits except inside a code span."""
    cells, cell, in_code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    cells.append(cell.strip())
    return cells


def table_rows(text):
    """The rows of §12's table, each a list of its cells."""
    start = text.index("\n## 12.")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return [split_row(line) for line in section.splitlines() if line.startswith("| `")]


def python_tests(path):
    """The names of `path`'s test functions that no skip or xfail mark guards."""
    if not path.is_file():
        return set()
    names = set()
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        found = re.match(r"(?:async )?def (test_\w+)\(", line)
        if not found:
            continue
        marks = []
        j = i - 1
        while j >= 0 and lines[j].startswith("@"):
            marks.append(lines[j])
            j -= 1
        if not any("skip" in m or "xfail" in m for m in marks):
            names.add(found.group(1))
    return names


def js_tests(path):
    """The titles of `path`'s `it(...)` tests."""
    if not path.is_file():
        return set()
    return {title for _, title in JS_IT.findall(path.read_text())}


def problems(text, py_dir=PY_DIR, js_dir=JS_DIR):
    """What is wrong with §12's table in `text`: a list of sentences, empty when all is well."""
    found = []
    rows = table_rows(text)
    if not rows:
        return ["§12 has no table rows"]
    for cells in rows:
        call = cells[0]
        if len(cells) != 5:
            found.append(f"{call}: {len(cells)} cells, not 5")
            continue
        _, javascript, status, _, checked = cells
        if not status.startswith(STATUSES):
            found.append(f"{call}: status {status!r}")
        py_refs, js_refs = [], []
        for ref in re.findall(r"`([^`]+)`", checked):
            if m := PY_REF.match(ref):
                py_refs.append(m.groups())
            elif m := JS_REF.match(ref):
                js_refs.append(m.groups())
            else:
                found.append(f"{call}: {ref!r} names no test of either suite")
        if not py_refs:
            found.append(f"{call}: no Python test named")
        if not js_refs and javascript != "—":
            found.append(f"{call}: no JavaScript test named")
        for file, name in py_refs:
            if name not in python_tests(py_dir / file):
                found.append(f"{call}: {file}::{name} is not a test (or is skipped)")
        for file, title in js_refs:
            if title not in js_tests(js_dir / file):
                found.append(f"{call}: {file} has no it({title!r})")
    return found


def test_every_row_names_tests_of_both_suites_that_exist():
    assert problems(DOC.read_text()) == []


def test_a_row_naming_a_missing_or_skipped_test_is_found(tmp_path):
    (tmp_path / "test_e2b_a.py").write_text(
        "def test_there():\n    pass\n\n"
        "@pytest.mark.skip(reason='x')\ndef test_skipped():\n    pass\n"
    )
    (tmp_path / "a.test.mjs").write_text("it('is there', () => {})\nit.skip('skipped', () => {})\n")
    row = "| `f()` | `f()` | supported | does f | {} |"

    def check(refs):
        doc = "\n## 12. Calls\n\n| a | b | c | d | e |\n|---|---|---|---|---|\n" + row.format(refs)
        return problems(doc, tmp_path, tmp_path)

    assert check("`test_e2b_a.py::test_there`, `a.test.mjs::is there`") == []
    assert check("`test_e2b_a.py::test_gone`, `a.test.mjs::is there`") != []
    assert check("`test_e2b_a.py::test_skipped`, `a.test.mjs::is there`") != []
    assert check("`test_e2b_a.py::test_there`, `a.test.mjs::skipped`") != []
    assert check("`test_e2b_a.py::test_there`, `b.test.mjs::is there`") != []
    assert check("`test_e2b_a.py::test_there`") != []  # no JavaScript test
    assert check("`a.test.mjs::is there`") != []  # no Python test
    assert check("`test_e2b_a.py::test_there`, `a.test.mjs::is there`, `typo`") != []
