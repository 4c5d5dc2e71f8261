"""Docs that run: every Python block of the documentation (``docs/*.md``) and the README
runs, page by page, in order, as a reader would paste them (tests/docs_blocks.py), on a
Redis the tests started; fragments are at most one block in ten. A print that says what it
prints (``print(x)  # -> True 99``) must print that. The site builds with
``mkdocs build --strict`` (broken links and references fail) when MkDocs is installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.docs_blocks import LEFT_OUT, ROOT, WrongOutput, blocks, pages, run_page

pytestmark = pytest.mark.timeout(180)
RUNNABLE = [page for page in pages() if any(not b.fragment for b in blocks(page))]


def test_fragments_are_at_most_one_block_in_ten() -> None:
    found = [block for page in pages() for block in blocks(page)]
    fragments = [block.where for block in found if block.fragment]
    assert len(found) >= 20
    assert len(fragments) * 10 <= len(found), fragments


def test_output_comments_are_on_prints() -> None:
    found = [block for page in pages() for block in blocks(page)]
    said = [output for block in found for output in block.outputs().values()]  # or raises
    assert len(said) >= 10  # the docs use the convention


def page_of(tmp_path: Path, *codes: str) -> Path:
    """A page in ``tmp_path`` with a Python block of each of ``codes``."""
    page = tmp_path / "page.md"
    page.write_text("".join(f"Some prose.\n\n```python\n{code}```\n\n" for code in codes))
    return page


@pytest.fixture
def own_page_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_page`` in this process: the module it makes is gone afterwards."""
    monkeypatch.setitem(sys.modules, "docs_page", types.ModuleType("docs_page"))


@pytest.mark.usefixtures("own_page_module")
def test_the_checker_holds_prints_to_their_output_comments(tmp_path: Path) -> None:
    right = page_of(
        tmp_path,
        "def report(n):\n    print(n, 'left')  # -> ... left\n",
        "report(99)\nprint(1 + 1)  # -> 2  \nprint('a', 'b', sep='\\n')\n# -> a\n# -> b\n",
        "import asyncio\nawait asyncio.sleep(0)\nprint(round(0.25, 1), 's')  # -> ... s\n",
    )
    assert run_page(right, "memory://") == (3, [])

    wrong = page_of(tmp_path, "x = 98\n", "print(True, x)  # -> True 99\nprint('after')\n")
    with pytest.raises(WrongOutput) as refused:
        run_page(wrong, "memory://")
    assert str(refused.value) == (
        f"{wrong}:10: the comment says it prints\n    'True 99'\nbut it printed\n    'True 98'"
    )
    swallowed = page_of(tmp_path, "try:\n    print(1)  # -> 2\nexcept Exception:\n    pass\n")
    with pytest.raises(WrongOutput, match="page.md:5: the comment says it prints"):
        run_page(swallowed, "memory://")


@pytest.mark.usefixtures("own_page_module")
def test_the_checker_refuses_an_output_comment_it_cannot_check(tmp_path: Path) -> None:
    never = page_of(tmp_path, "if False:\n    print('no')  # -> no\n")
    with pytest.raises(WrongOutput, match=r"output comment that never ran: .*page.md:5"):
        run_page(never, "memory://")
    loose = page_of(tmp_path, "x = 1 + 1  # -> 2\n")
    with pytest.raises(WrongOutput, match=r"page.md:4: an output comment .* on or under no print"):
        run_page(loose, "memory://")


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_block_of_the_page_runs(page: Path, redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "tests.docs_blocks", str(page), redis_url],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    *printed, ran = done.stdout.strip().splitlines()
    left_out = [line.removeprefix(LEFT_OUT) for line in printed if line.startswith(LEFT_OUT)]
    assert int(ran) + len(left_out) == sum(not b.fragment for b in blocks(page))
    if left_out:  # the rest of the page ran and passed
        pytest.skip(f"ran {ran} blocks; left out {'; '.join(left_out)} (the bench extra)")


@pytest.mark.long  # .ci/run builds the site first anyway
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra")
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=150,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "index.html").exists()
    assert (tmp_path / "reference" / "ratelimit" / "index.html").exists()
    # the settings' defaults show as values, never as the sentinel (docs/settings_defaults.py)
    reference = [*(tmp_path / "reference").rglob("*.html"), tmp_path / "search/search_index.json"]
    assert [page for page in reference if "_UNSET" in page.read_text()] == []
