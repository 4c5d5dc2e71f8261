"""The Python code blocks of the documentation (``docs/*.md`` and ``README.md``), and a
runner for one page's blocks: ``python -m tests.docs_blocks PAGE [REDIS_URL]`` runs them in
order in one namespace, as a reader would paste them (tests/test_docs.py runs every page).

A block right after a ``<!-- fragment -->`` line is not run (a piece of a larger program: a
settings file, a view module); fragments are counted, at most one block in ten.

Blocks run in the main thread, with no event loop running (so the sync API can be used);
a block with a top-level ``await`` runs on one event loop the page keeps in a thread of its
own. ``redis://localhost:6379`` in a block is the Redis the tests started.

A block that imports a peer library (the migration guide's "before" code) runs only where
that library is installed (the ``bench`` extra); elsewhere it is left out and named, so the
README's test command passes with the ``test`` extra alone.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import re
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)```(\w*)[^\n]*$")
FRAGMENT = "<!-- fragment -->"
PEERS = {"limits", "slowapi", "fastapi_limiter", "pyrate_limiter", "flask_limiter"}
"""Libraries a block may import that only the ``bench`` extra installs."""
LEFT_OUT = "left out: "


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    code: str
    fragment: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def missing(self) -> list[str]:
        """The peer libraries the block imports that are not installed here."""
        names: set[str] = set()
        for node in ast.walk(ast.parse(self.code)):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
        return sorted(n for n in names & PEERS if importlib.util.find_spec(n) is None)


def pages() -> list[Path]:
    """Every page with prose and code: the docs and the README."""
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


def blocks(page: Path) -> list[Block]:
    """The page's ``python`` blocks, in order."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    n = 0
    while n < len(lines):
        opened = FENCE.match(lines[n])
        if opened is None:
            n += 1
            continue
        indent, language, start = opened.group(1), opened.group(2), n
        n += 1
        body: list[str] = []
        while n < len(lines) and lines[n].strip() != "```":
            body.append(lines[n][len(indent) :])
            n += 1
        n += 1
        if language == "python":
            before = lines[start - 1].strip() if start else ""
            found.append(Block(page, start + 1, "\n".join(body) + "\n", before == FRAGMENT))
    return found


class PageLoop:
    """One event loop in a thread, for the page's blocks that ``await``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def run_page(page: Path, redis_url: str) -> tuple[int, list[str]]:
    """Run the page's blocks; the number run, and the blocks left out (peers missing)."""
    module = types.ModuleType("docs_page")  # a module of its own: dataclasses look it up
    sys.modules[module.__name__] = module
    namespace: dict[str, Any] = module.__dict__
    loop: PageLoop | None = None
    ran = 0
    left_out: list[str] = []
    try:
        for block in blocks(page):
            if block.fragment:
                continue
            missing = block.missing()
            if missing:
                left_out.append(f"{block.where} needs {', '.join(missing)}")
                continue
            code = block.code.replace("redis://localhost:6379", redis_url)
            compiled = compile(code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            result = eval(compiled, namespace)  # the docs' own code
            if asyncio.iscoroutine(result):
                loop = loop or PageLoop()
                loop.run(result)
            ran += 1
    finally:
        if loop is not None:
            loop.close()
    return ran, left_out


if __name__ == "__main__":
    ran, left_out = run_page(Path(sys.argv[1]).resolve(), *sys.argv[2:3] or ["memory://"])
    for where in left_out:
        print(f"{LEFT_OUT}{where}")
    print(ran)  # the last line
