"""Docs that run: every Python block of the documentation (``docs/*.md``) and the README
runs, page by page, in order, as a reader would paste them (tests/docs_blocks.py), on a
Redis the tests started; fragments are at most one block in ten. The site builds with
``mkdocs build --strict`` (broken links and references fail) when MkDocs is installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_blocks import LEFT_OUT, ROOT, blocks, pages

pytestmark = pytest.mark.timeout(180)
RUNNABLE = [page for page in pages() if any(not b.fragment for b in blocks(page))]


def test_fragments_are_at_most_one_block_in_ten() -> None:
    found = [block for page in pages() for block in blocks(page)]
    fragments = [block.where for block in found if block.fragment]
    assert len(found) >= 20
    assert len(fragments) * 10 <= len(found), fragments


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
