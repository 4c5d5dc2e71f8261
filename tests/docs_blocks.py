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

**Output comments.** A ``print(...)`` whose line ends with ``# -> TEXT`` says what it prints,
and the runner holds it to that: every time that print runs, what it printed (less the
final newline) must be ``TEXT``, and it must run at least once on the page. Output too long
for the print's line, or of several lines, goes on comment lines right under the print, one
``# -> LINE`` each (after the one on the print's line, if there is one). ``...`` in the
text stands for any run of characters (values that vary, such as times, or the tail of a
long message), as in doctest's ELLIPSIS. Any other comment on a print line is an
explanation, never checked; a ``# ->`` comment anywhere but on or under a print is an
error, so that nothing reads as checked that is not::

    print(decision.allowed, decision.remaining)  # -> True 4
    print(exc)  # -> call refused for key 'login': ...; retry after ... s
    print(holds)
    # -> [PenaltyHold(key='login', selector='ip', value='198.51.100.4', left=3600.0)]

A wrong output fails the page once its block has run (``WrongOutput``, naming the page's
line, what the comment says and what was printed: an ``except`` in the block cannot
swallow it), as does a commented print that never ran. The page's namespace has a
``print`` of its own, which records and then prints as usual, so the prints of the
functions a block defines are seen too.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import importlib.util
import io
import re
import sys
import threading
import tokenize
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)```(\w*)[^\n]*$")
FRAGMENT = "<!-- fragment -->"
PEERS = {"limits", "slowapi", "fastapi_limiter", "pyrate_limiter", "flask_limiter"}
"""Libraries a block may import that only the ``bench`` extra installs."""
LEFT_OUT = "left out: "
OUTPUT = "->"
"""What opens an output comment, after the ``#``: ``print(x)  # -> what it prints``."""
ELLIPSIS = "..."
"""In an output comment, any run of characters."""


class WrongOutput(AssertionError):
    """A print printed something other than what its output comment says, or never ran."""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    code: str
    fragment: bool

    @property
    def where(self) -> str:
        return self.at(self.line)

    def at(self, line: int) -> str:
        """``page:line``, the page relative to the repository when it is in it."""
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{line}"

    def outputs(self) -> dict[int, OutputComment]:
        """The block's output comments, by every line of the print they belong to (the
        block's own numbering, from 1); ``WrongOutput`` for one that belongs to no print."""
        comments = _comments(self.code)
        found: dict[int, OutputComment] = {}
        for node in ast.walk(ast.parse(self.code)):
            if not _is_print(node):
                continue
            last = node.end_lineno or node.lineno
            said: list[str] = []
            line = last if last in comments and comments[last].output is not None else last + 1
            while line in comments and (line == last or comments[line].alone):
                output = comments.pop(line).output
                if output is None:
                    break
                said.append(output)
                line += 1
            if said:
                where = self.at(self.line + node.lineno)
                output_comment = OutputComment(where, "\n".join(said))
                found.update(dict.fromkeys(range(node.lineno, last + 1), output_comment))
        for line, left in sorted(comments.items()):
            if left.output is not None:
                raise WrongOutput(
                    f"{self.at(self.line + line)}: an output comment ('# {OUTPUT} ...') on or "
                    "under no print(...)"
                )
        return found

    def missing(self) -> list[str]:
        """The peer libraries the block imports that are not installed here."""
        names: set[str] = set()
        for node in ast.walk(ast.parse(self.code)):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
        return sorted(n for n in names & PEERS if importlib.util.find_spec(n) is None)


@dataclass(eq=False)
class OutputComment:
    """What a print says it prints (``# -> ...``), and what it printed each time it ran."""

    where: str  # the page's line of the print
    expected: str
    printed: list[str] = field(default_factory=list)

    def matches(self, text: str) -> bool:
        pattern = ".*".join(re.escape(part) for part in self.expected.split(ELLIPSIS))
        return re.fullmatch(pattern, text, re.DOTALL) is not None

    def check(self) -> None:
        """``WrongOutput`` when a run printed something else."""
        for text in self.printed:
            if not self.matches(text):
                raise WrongOutput(
                    f"{self.where}: the comment says it prints\n    {self.expected!r}\n"
                    f"but it printed\n    {text!r}"
                )


class Comment(NamedTuple):
    alone: bool
    """Whether the comment is the whole line."""
    output: str | None
    """The text after ``# ->`` of an output comment; ``None`` for any other comment."""


def _comments(code: str) -> dict[int, Comment]:
    """The code's comments, by line."""
    found: dict[int, Comment] = {}
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.removeprefix("#").strip()
            output = text.removeprefix(OUTPUT).strip() if text.startswith(OUTPUT) else None
            alone = token.line[: token.start[1]].strip() == ""
            found[token.start[0]] = Comment(alone, output)
    return found


def _is_print(node: ast.AST) -> TypeGuard[ast.Expr]:
    """Whether ``node`` is a statement ``print(...)``."""
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "print"
    )


class CheckedPrint:
    """The page's ``print``: prints as usual, and records what each print with an output
    comment printed (found by the caller's block and line)."""

    def __init__(self) -> None:
        self.outputs: dict[tuple[str, int], OutputComment] = {}

    def add(self, block: Block) -> list[OutputComment]:
        """Watch ``block``'s output comments; the comments, to check once it has run."""
        found = block.outputs()
        for line, output in found.items():
            self.outputs[block.where, line] = output
        return list({id(output): output for output in found.values()}.values())

    def __call__(self, *values: object, **options: Any) -> None:
        caller = sys._getframe(1)
        output = self.outputs.get((caller.f_code.co_filename, caller.f_lineno))
        if output is None or options.get("file") not in (None, sys.stdout):
            builtins.print(*values, **options)
            return
        text = io.StringIO()
        builtins.print(*values, **{**options, "file": text})
        printed = text.getvalue()
        sys.stdout.write(printed)
        if options.get("flush"):
            sys.stdout.flush()
        end = options.get("end", "\n")
        output.printed.append(printed.removesuffix("\n" if end is None else end))


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
        if not self.thread.is_alive():
            self.loop.close()


def run_page(page: Path, redis_url: str) -> tuple[int, list[str]]:
    """Run the page's blocks; the number run, and the blocks left out (peers missing)."""
    module = types.ModuleType("docs_page")  # a module of its own: dataclasses look it up
    sys.modules[module.__name__] = module
    namespace: dict[str, Any] = module.__dict__
    checked_print = namespace["print"] = CheckedPrint()
    watched: list[OutputComment] = []
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
            outputs = checked_print.add(block)
            watched.extend(outputs)
            code = block.code.replace("redis://localhost:6379", redis_url)
            compiled = compile(code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            result = eval(compiled, namespace)  # the docs' own code
            if asyncio.iscoroutine(result):
                loop = loop or PageLoop()
                loop.run(result)
            ran += 1
            for output in watched:  # a print of an earlier block's function may run here
                output.check()
    finally:
        if loop is not None:
            loop.close()
    never = [output.where for output in watched if not output.printed]
    if never:
        raise WrongOutput(f"prints with an output comment that never ran: {', '.join(never)}")
    return ran, left_out


if __name__ == "__main__":
    ran, left_out = run_page(Path(sys.argv[1]).resolve(), *sys.argv[2:3] or ["memory://"])
    for where in left_out:
        print(f"{LEFT_OUT}{where}")
    print(ran)  # the last line
