"""The layering rules of DESIGN §2, checked on the source: the folders say the layers, each
imports only the ones below it, one module per foreign library, and sizes that mean something."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from ratelimit import algorithms
from ratelimit.algorithms import BY_NAME

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
    assert modules_importing("pyparsing") == {"rules/grammar.py"}


def test_only_redis_backend_modules_import_redis() -> None:
    importing = modules_importing("redis")
    assert importing
    assert all(name.startswith("backends/redis/") for name in importing), importing


def test_front_ends_never_build_keys() -> None:
    assert modules_importing("ratelimit") >= {"front/limiter.py"}
    for path in PACKAGE.rglob("*.py"):
        relative = str(path.relative_to(PACKAGE))
        if "backends/redis/" not in relative:
            assert "backends.redis.keys" not in path.read_text(), path.name
        if not relative.startswith("backends/"):
            assert "backends.naming" not in path.read_text(), path.name


def test_lua_lives_in_files_with_a_header() -> None:
    scripts = [
        s for s in (PACKAGE / "backends" / "redis" / "lua").glob("*.lua") if s.name[0] != "_"
    ]
    assert scripts
    for script in scripts:
        lines = script.read_text().splitlines()
        header = lines[: next(i for i, line in enumerate(lines) if not line.startswith("--"))]
        assert any("KEYS" in line for line in header)
        assert any("ARGV" in line for line in header)
        assert any("Returns" in line for line in header)


def test_plans_are_immutable_and_know_nothing_of_redis() -> None:
    import dataclasses

    import pytest

    from ratelimit.core.plan import Plan, cached_plan, compile_tree
    from ratelimit.rules.tree import to_tree

    plan = cached_plan(compile_tree(to_tree("user:5/s")), "ns", "k", ("u",), 1, "sliding-log")
    assert isinstance(plan, Plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.cost = 2  # type: ignore[misc]
    assert not hasattr(plan, "memo")
    source = (PACKAGE / "core" / "plan.py").read_text()
    assert "wire" not in source
    assert "Lua" not in source
    assert "redis" not in source.lower()


def test_the_limit_front_end_does_not_import_the_limiter() -> None:
    assert "ratelimit.front.limiter" not in package_imports()["ratelimit.front.limit"]


def package_imports() -> dict[str, set[str]]:
    """Each module of the package (dotted) and the package's modules it imports, counting
    those imported only for type checking."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                for alias in node.names:  # "from package import submodule" names a module
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name in modules}
        graph[name] = targets - {name}
    return graph


def test_the_only_import_loop_is_rules_and_grammar() -> None:
    """rules/tree.py parses text through rules/grammar.py, which builds trees: a loop by design (the
    grammar imports the rule types it builds; the rule types offer parsing)."""
    graph = package_imports()
    assert "ratelimit.backends.redis.keys" in graph

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for target in graph[todo.pop()]:
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    reach = {name: reachable(name) for name in graph}
    loops = {
        frozenset({a, b})
        for a in graph
        for b in reach[a]
        if a != b and a in reach[b] and (b in graph[a] or a in graph[b])
    }
    assert loops == {frozenset({"ratelimit.rules.tree", "ratelimit.rules.grammar"})}


ALGORITHM_NAMES = set(BY_NAME)  # every algorithm's name, and the constants that hold one
ALGORITHM_CONSTANTS = {
    name
    for name in algorithms.__all__
    if isinstance(getattr(algorithms, name), str) and getattr(algorithms, name) in BY_NAME
} | {"ALGORITHMS", "BY_NAME"}


def _names_an_algorithm(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in ALGORITHM_NAMES
    if isinstance(node, ast.Name):
        return node.id in ALGORITHM_CONSTANTS or "algorithm" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "algorithm" in node.attr.lower() or _names_an_algorithm(node.value)
    if isinstance(node, ast.Tuple):
        return any(_names_an_algorithm(element) for element in node.elts)
    return False


def test_the_algorithm_is_asked_not_named_outside_its_modules() -> None:
    """Issue 22: every layer asks the algorithm object; a backend says what it supports in
    a table. Comparing an algorithm's name (``plan.algorithm == GCRA``, ``algorithm in
    (...)``) outside ``ratelimit/algorithms/`` stays within five places."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        relative = str(path.relative_to(PACKAGE))
        if relative.startswith("algorithms/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                _names_an_algorithm(operand) for operand in (node.left, *node.comparators)
            ):
                found.append(f"{relative}:{node.lineno}")
    assert len(found) <= 5, found


def test_no_module_is_over_600_lines_and_no_function_over_80() -> None:
    """Sizes that say what matters: a module a reader can hold, a function that fits on a
    screen. A module is split by meaning, never to fit the number."""
    long = {}
    for path in PACKAGE.rglob("*.py"):
        if "proto" in path.parts:
            continue  # generated by protoc
        text = path.read_text()
        where = str(path.relative_to(PACKAGE))
        if (lines := len(text.splitlines())) > 600:
            long[where] = lines
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > 80:
                long[f"{where}:{node.name}"] = lines
    assert not long, long


LAYERS = (
    ("errors",),
    ("rules",),
    ("algorithms",),
    ("core",),
    ("backends", "metrics"),
    ("overrides",),
    ("pipeline",),
    ("penalties",),
    ("front",),
    ("asgi", "sync"),
    ("wsgi", "service"),
    ("cli",),
    ("flask", "django", "plan", "decision", "settings", "prometheus", "__init__", "__main__"),
)
"""The package's folders and top modules from the bottom up (docs/architecture.md draws
them): each imports only from itself and the rows below it."""


def test_each_layer_imports_only_the_layers_below_it() -> None:
    floor = {part: n for n, row in enumerate(LAYERS) for part in row}
    tops = {path.stem for path in PACKAGE.glob("*.py")} | {
        path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()
    }
    assert tops == set(floor), tops ^ set(floor)  # every part has its row
    upward = set()
    for name, targets in package_imports().items():
        part = name.split(".")[1] if "." in name else "__init__"
        for target in targets:
            to = target.split(".")[1] if "." in target else "__init__"
            if to != part and floor[to] >= floor[part]:
                upward.add(f"{name} -> {target}")
    assert not upward, sorted(upward)


def test_at_most_ten_modules_at_the_top() -> None:
    assert len(list(PACKAGE.glob("*.py"))) <= 10


def test_the_twins_named_in_the_algorithms_docstring_exist() -> None:
    """The list of code that must agree names files and tests that are there."""
    import re

    import ratelimit.algorithms

    doc = ratelimit.algorithms.__doc__ or ""
    root = PACKAGE.parent
    for name in set(re.findall(r"``([\w/]+\.(?:py|lua|sql))(?:::(\w+))?``", doc)):
        path, test = name
        candidates = [root / path, PACKAGE / path, PACKAGE / "backends/redis/lua" / path]
        found = next((c for c in candidates if c.exists()), None)
        assert found is not None, path
        if test:
            assert f"def {test}(" in found.read_text(), name


def test_front_ends_read_no_parts_of_the_limiter() -> None:
    """Issue 22: the HTTP edge, the service, the CLI, limits and concurrency slots go
    through the limiter's public door (``decide``, ``check``, ``ping``) or the Decider they
    are handed, never through its parts."""
    import re

    parts = re.compile(r"\.(decider|policy|hooks|backend|settings|denials|background)\b")
    front = [*PACKAGE.glob("asgi/*.py"), *PACKAGE.glob("wsgi/*.py"), *PACKAGE.glob("service/*.py")]
    front += [
        PACKAGE / name for name in ("front/concurrency.py", "front/limit.py", "cli/command.py")
    ]
    found = [
        f"{path.name}:{n}"
        for path in front
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if parts.search(line.split("#")[0]) and not line.lstrip().startswith(("from ", "import "))
    ]
    assert not found, found


def test_the_exception_tree_drawn_in_errors_is_the_one_there_is() -> None:
    """Every exception the package exports is drawn in ``errors.py``'s tree, under its
    package base, and with the builtin it also is."""
    import ratelimit
    import ratelimit.asgi
    import ratelimit.errors

    drawn = {}
    for line in (ratelimit.errors.__doc__ or "").splitlines():
        stripped = line.strip(" │├└─")
        if stripped and stripped[0].isupper() and len(line) - len(line.lstrip(" │├└─")) >= 4:
            name = stripped.split()[0]
            drawn[name] = (len(line) - len(stripped), stripped)
    exported = {
        name: cls
        for module in (ratelimit, ratelimit.asgi)
        for name in module.__all__
        if isinstance(cls := getattr(module, name), type) and issubclass(cls, Exception)
    }
    assert set(exported) <= set(drawn), set(exported) - set(drawn)
    for name, cls in exported.items():
        depth, text = drawn[name]
        parents = [b for b in cls.__bases__ if b.__module__.startswith("ratelimit")]
        if name != "RateLimitError":
            (parent,) = parents
            assert drawn[parent.__name__][0] < depth, name  # drawn under its base
        for builtin in (
            b for b in cls.__bases__ if b.__module__ == "builtins" and b is not Exception
        ):
            assert f"also {builtin.__name__}" in text, name


def _code_lines(path: Path) -> list[str]:
    """A Lua file's lines of code, white space folded (comments and blank lines left out)."""
    lines = (" ".join(line.split("--")[0].split()) for line in path.read_text().splitlines())
    return [line for line in lines if line and line not in ("end", "else", "}")]


def test_no_lua_is_copied_between_scripts_and_fragments() -> None:
    """The one-rule scripts are assembled from the fragments the general scripts join
    (``scripts.py``): no run of six lines of code stands in two Lua files."""
    lua = PACKAGE / "backends" / "redis" / "lua"
    runs: dict[tuple[str, ...], str] = {}
    copied = []
    for path in sorted(lua.glob("*.lua")):
        lines = _code_lines(path)
        for i in range(len(lines) - 5):
            run = tuple(lines[i : i + 6])
            if runs.setdefault(run, path.name) != path.name:
                copied.append(f"{runs[run]} ~ {path.name}: {run[0]}")
    assert not copied, copied


def test_the_one_rule_scripts_are_joined_from_the_shared_fragments() -> None:
    """Each one-rule script decides its rule with the very block (``--@`` joined) that its
    general script's tree of one leaf runs, after the same ``_time.lua``."""
    from ratelimit.backends.redis.script import scripts

    for one, general, block in (
        (scripts.SLIDING_LOG_ONE, scripts.SLIDING_LOG_LUA, "_log_one.lua"),
        (scripts.GCRA_ONE, scripts.GCRA_LUA, "_gcra_one.lua"),
    ):
        joined = scripts.lua(block)
        assert "\n--@ " not in joined
        assert joined in one.source.decode()
        assert joined in general
        time = scripts.lua("_time.lua")
        assert time in one.source.decode()
        assert time in general


FEATURES = ("decisions", "settles", "resets", "overrides", "penalties", "slots")
"""What every store does for the layers above it (``backends/base.py``'s protocols)."""

STORES = {
    "backends/memory": "backend.py",
    "backends/redis/script": "engine.py",
    "backends/redis/command": "engine.py",
    "backends/postgres": "backend.py",
}
"""Each store's folder, and the module of its backend class, which takes in its features."""
SHARED = {"backends/redis/script": "backends/redis", "backends/redis/command": "backends/redis"}
"""A folder whose engines share the feature files the folder above holds (both Redis engines
keep overrides and penalties alike)."""
REFUSED = {("backends/postgres", "slots"): ("PostgresBackend", "holds_slots")}
"""A feature a store refuses, and the flag of its backend class that says so."""


def store_features() -> dict[str, dict[str, str]]:
    """Where each store keeps each feature, read from the folders (docs/architecture.md,
    "Stores and their features"): the file named after it in the store's folder, or in the
    folder its engines share, or ``refused``."""
    table: dict[str, dict[str, str]] = {}
    for store in STORES:
        row = table[store] = {}
        for feature in FEATURES:
            for folder in (store, SHARED.get(store)):
                if folder is not None and (PACKAGE / folder / f"{feature}.py").is_file():
                    row[feature] = f"{folder}/{feature}.py"
                    break
            else:
                row[feature] = "refused"
    return table


def test_every_store_keeps_every_feature_or_says_it_refuses_it() -> None:
    """The twins of one feature are one column of a directory listing: every store keeps each
    feature in a module named after it, which its backend's module takes in, or refuses it
    where its backend class says so."""
    import importlib

    for store, row in store_features().items():
        backend = PACKAGE / store / STORES[store]
        taken = set()
        for node in ast.walk(ast.parse(backend.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                taken.add(node.module)
                taken.update(f"{node.module}.{alias.name}" for alias in node.names)
        for feature, where in row.items():
            if where == "refused":
                assert (store, feature) in REFUSED, f"{store} keeps no {feature}.py"
                name, flag = REFUSED[store, feature]
                module = "ratelimit." + (store + "/" + STORES[store]).replace("/", ".")[:-3]
                assert getattr(getattr(importlib.import_module(module), name), flag) is False
                continue
            module = "ratelimit." + where[: -len(".py")].replace("/", ".")
            assert module in taken, f"{backend.name} of {store} does not take in {where}"
    assert set(REFUSED) <= {(s, f) for s, r in store_features().items() for f in r}


def test_every_script_the_engines_run_is_named_by_the_feature_module_that_runs_it() -> None:
    """The Lua files (not the ``_`` blocks they join) each belong to one module of the script
    engine: its decisions, settles, resets, slots, or the engine's own counter calls."""
    lua = PACKAGE / "backends/redis/lua"
    redis = PACKAGE / "backends/redis"
    runs = {
        "script/scripts.py": {
            "sliding_log.lua",
            "window_counters.lua",
            "gcra.lua",
            "sliding_log_one.lua",
            "gcra_one.lua",
            "settle_log.lua",
            "settle_windows.lua",
            "settle_gcra.lua",
        },
        "script/resets.py": {"reset.lua"},
        "script/slots.py": {"slots.lua"},
        "script/engine.py": {"counter_update.lua", "counter_sync.lua"},
    }
    scripts = {path.name for path in lua.glob("*.lua") if not path.name.startswith("_")}
    assert scripts == set().union(*runs.values())
    for module, names in runs.items():
        text = (redis / module).read_text()
        for name in names:
            assert f'"{name}"' in text, (module, name)
    for name in runs["script/scripts.py"]:  # what decisions.py and settles.py send, by algorithm
        kind = "settles.py" if name.startswith("settle_") else "decisions.py"
        assert name in (redis / "script" / kind).read_text(), (kind, name)


def test_import_ratelimit_brings_no_store_client_and_no_grammar() -> None:
    """``import ratelimit`` stays light (bench/import_time.py measures it beside ``limits``):
    redis-py and valkey-py come with the first Redis backend made, asyncpg with the first
    PostgreSQL one, pyparsing with the first rule text parsed."""
    code = (
        "import sys, ratelimit\n"
        "heavy = ('redis', 'valkey', 'asyncpg', 'pyparsing', 'grpc', 'starlette')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "rl = ratelimit.RateLimit.from_url('redis://127.0.0.1:1/0')\n"
        "print(type(rl.storage).__name__, 'redis' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == ["[]", "RedisScriptBackend True"]
