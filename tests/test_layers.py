"""The layering rules of DESIGN §2, checked on the source: one module per foreign library."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ratelimit"


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def modules_importing(root: str) -> set[str]:
    return {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if root in imported_roots(path)
    }


def test_only_the_grammar_imports_pyparsing() -> None:
    assert modules_importing("pyparsing") == {"grammar.py"}


def test_only_redis_backend_modules_import_redis() -> None:
    importing = modules_importing("redis")
    assert importing
    assert all(name.startswith("backends/redis_") for name in importing), importing


def test_front_ends_never_build_keys() -> None:
    assert modules_importing("ratelimit") >= {"limiter.py"}
    for path in PACKAGE.glob("*.py"):
        assert "backends.keys" not in path.read_text(), path.name


def test_lua_lives_in_files_with_a_header() -> None:
    scripts = [s for s in (PACKAGE / "backends" / "lua").glob("*.lua") if s.name[0] != "_"]
    assert scripts
    for script in scripts:
        lines = script.read_text().splitlines()
        header = lines[: next(i for i, line in enumerate(lines) if not line.startswith("--"))]
        assert any("KEYS" in line for line in header)
        assert any("ARGV" in line for line in header)
        assert any("Returns" in line for line in header)
