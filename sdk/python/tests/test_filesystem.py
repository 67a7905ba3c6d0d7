"""The filesystem calls (stat, exists, list_dir, make_dir, move, remove) against a real
`corral serve`: what they answer, that a link the sandbox planted is never followed, the bounds
of a listing, and that another key's sandbox is out of reach."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from corral import (
    AsyncSandbox,
    EntryInfo,
    InvalidPathError,
    InvalidRequestError,
    NotFoundError,
    PathExistsError,
    Sandbox,
)

from corral_testing import create_key


@pytest.fixture
def sb(corral_url: str) -> Iterator[Sandbox]:
    with Sandbox(corral_url) as sandbox:
        yield sandbox


def sh(sb: Sandbox, cmd: str) -> str:
    result = sb.commands.run(cmd, check=True)
    return result.stdout


def test_stat_list_make_dir_move_remove(sb: Sandbox) -> None:
    sb.files.write("tree/x.txt", "12345")
    sb.files.write("tree/sub/y.txt", "y")

    info = sb.files.stat("tree/x.txt")
    assert (info.path, info.name, info.type, info.size, info.mode) == (
        "tree/x.txt",
        "x.txt",
        "file",
        5,
        0o644,
    )
    assert info.modified.endswith("Z") and info.symlink_target is None
    root = sb.files.stat("")
    assert (root.path, root.type) == ("", "dir")
    assert sb.files.exists("tree/sub") and not sb.files.exists("tree/nope")
    with pytest.raises(NotFoundError):
        sb.files.stat("tree/nope")

    assert [(e.path, e.type) for e in sb.files.list_dir("tree")] == [
        ("tree/sub", "dir"),
        ("tree/x.txt", "file"),
    ]
    assert [e.path for e in sb.files.list_dir("tree", depth=2)] == [
        "tree/sub",
        "tree/sub/y.txt",
        "tree/x.txt",
    ]
    assert "tree" in [e.path for e in sb.files.list_dir()]
    with pytest.raises(NotFoundError):
        sb.files.list_dir("nope")

    assert sb.files.make_dir("made/a/b") is True
    assert sb.files.make_dir("made/a/b") is False
    assert sb.files.stat("made/a").type == "dir"
    with pytest.raises(InvalidPathError):
        sb.files.make_dir("tree/x.txt/below")  # a file on the way

    moved = sb.files.move("tree/x.txt", "elsewhere/deeper/x.txt")
    assert isinstance(moved, EntryInfo)
    assert (moved.path, moved.size) == ("elsewhere/deeper/x.txt", 5)
    assert not sb.files.exists("tree/x.txt")
    sb.files.write("taken.txt", "taken")
    with pytest.raises(PathExistsError):
        sb.files.move("elsewhere/deeper/x.txt", "taken.txt")
    assert sb.files.read("taken.txt") == "taken"
    assert sb.files.read("elsewhere/deeper/x.txt") == "12345"
    with pytest.raises(NotFoundError):
        sb.files.move("no-such", "anywhere")

    sb.files.remove("elsewhere", recursive=True)
    assert not sb.files.exists("elsewhere")
    with pytest.raises(NotFoundError):
        sb.files.remove("elsewhere", recursive=True)
    # Without `recursive`, remove deletes regular files only.
    with pytest.raises(InvalidPathError):
        sb.files.remove("made")
    assert sb.files.exists("made")


def test_paths_are_checked(sb: Sandbox) -> None:
    for bad in ("/etc", "../x", "a/../../x"):
        with pytest.raises(InvalidPathError):
            sb.files.stat(bad)
        with pytest.raises(InvalidPathError):
            sb.files.list_dir(bad)
        with pytest.raises(InvalidPathError):
            sb.files.make_dir(bad)
        with pytest.raises(InvalidPathError):
            sb.files.remove(bad, recursive=True)
    with pytest.raises(InvalidPathError):
        sb.files.move("/etc/passwd", "stolen")


def test_links_the_sandbox_planted_are_never_followed(sb: Sandbox, tmp_path: Path) -> None:
    # A directory of the host's that the test owns, named by absolute path inside the sandbox:
    # were the host to follow the links, it would write or remove here.
    bait = tmp_path / "bait"
    bait.mkdir()
    (bait / "keep.txt").write_text("host file")
    sh(
        sb,
        f"cd /workspace && ln -s {bait} host && ln -s {bait}/keep.txt host-file "
        "&& ln -s /etc etc && mkdir real && echo data > real/a.txt",
    )

    link = sb.files.stat("host")
    assert (link.type, link.symlink_target) == ("symlink", str(bait))
    assert sb.files.stat("host-file").type == "symlink"
    listed = [e.path for e in sb.files.list_dir("", depth=5)]
    assert "host" in listed and "etc" in listed
    assert not any(p.startswith(("host/", "etc/")) for p in listed), listed

    for call in (
        lambda: sb.files.list_dir("host"),
        lambda: sb.files.stat("host/keep.txt"),
        lambda: sb.files.make_dir("host/planted"),
        lambda: sb.files.move("real/a.txt", "host/a.txt"),
        lambda: sb.files.move("host/keep.txt", "real/stolen.txt"),
        lambda: sb.files.remove("host/keep.txt", recursive=True),
        lambda: sb.files.remove("etc/passwd", recursive=True),
    ):
        with pytest.raises(InvalidPathError):
            call()

    # A link is moved and removed as itself.
    moved = sb.files.move("host-file", "real/link")
    assert (moved.type, moved.symlink_target) == ("symlink", str(bait / "keep.txt"))
    sb.files.remove("real/link", recursive=True)
    sb.files.remove("host", recursive=True)
    assert not sb.files.exists("host")

    # The host is unchanged: nothing made, moved or removed through the links.
    assert sorted(os.listdir(bait)) == ["keep.txt"]
    assert (bait / "keep.txt").read_text() == "host file"
    assert sb.files.read("real/a.txt") == "data\n"


def test_listings_are_bounded(sb: Sandbox, corral_url: str) -> None:
    for depth in (0, 33):
        with pytest.raises(InvalidRequestError):
            sb.files.list_dir("", depth=depth)
    sh(sb, "mkdir -p /workspace/big && cd /workspace/big && seq 10001 | xargs touch")
    with pytest.raises(InvalidRequestError) as excinfo:
        sb.files.list_dir("big")
    assert "more than 10000 entries" in str(excinfo.value)
    sh(sb, "rm /workspace/big/1")
    assert len(sb.files.list_dir("big")) == 10_000
    # Unknown query parameters are refused, not ignored.
    r = httpx.get(f"{corral_url}/v1/sandboxes/{sb.id}/files:list", params={"dir": "big"})
    assert r.status_code == 400


@pytest.mark.anyio
async def test_the_async_client_has_the_same_calls(corral_url: str) -> None:
    async with AsyncSandbox(corral_url) as sb:
        await sb.files.write("a/b.txt", "x")
        assert (await sb.files.stat("a/b.txt")).size == 1
        assert await sb.files.exists("a") and not await sb.files.exists("z")
        assert [e.path for e in await sb.files.list_dir("a")] == ["a/b.txt"]
        assert await sb.files.make_dir("c") is True
        assert (await sb.files.move("a/b.txt", "c/b.txt")).path == "c/b.txt"
        with pytest.raises(PathExistsError):
            await sb.files.move("c", "a")
        await sb.files.remove("c", recursive=True)
        assert not await sb.files.exists("c")


def test_another_key_reaches_nothing(tmp_path: Path, serve_with) -> None:
    keys = [create_key(tmp_path / "corral.db", name).secret for name in ("owner", "intruder")]
    with serve_with("") as url:
        with Sandbox(url, api_key=keys[0]) as owner:
            owner.files.write("secret/s.txt", "secret")
            intruder = httpx.Client(
                base_url=f"{url}/v1/sandboxes/{owner.id}",
                headers={"Authorization": f"Bearer {keys[1]}"},
            )
            with intruder:
                answers = [
                    intruder.get("/files:stat", params={"path": "secret/s.txt"}),
                    intruder.get("/files:list", params={"path": "secret", "depth": 2}),
                    intruder.post("/files:mkdir", json={"path": "planted"}),
                    intruder.post("/files:move", json={"from": "secret", "to": "gone"}),
                    intruder.post("/files:remove", json={"path": "secret"}),
                ]
            # As for an unknown sandbox: the answer does not tell that it exists.
            assert [r.status_code for r in answers] == [404] * 5, [r.text for r in answers]
            assert all("secret" not in r.text for r in answers)
            assert [e.path for e in owner.files.list_dir("", depth=2)] == [
                "secret",
                "secret/s.txt",
            ]
