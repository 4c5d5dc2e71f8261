"""Build the sdist and the wheel as a release would, and check what a user would get.

    python3 .ci/check_dist.py            # from anywhere; about half a minute

1. ``python -m build``, in a throwaway venv of its own (``build`` and ``twine``): the sdist,
   then the wheel built from that sdist, so the sdist is shown to hold what building needs.
2. ``twine check --strict``: the metadata and the README render as an index would show them.
3. The wheel's metadata against pyproject.toml: name, version, ``Requires-Python``, the
   runtime dependencies and the extras.
4. The contents: the wheel holds every file git tracks under ``ratelimit/`` (``py.typed``, the
   Lua scripts, the Postgres schema, ...) and nothing else (no tests, no benchmarks); the
   sdist holds those, pyproject.toml, the README, and the LICENSE if there is one.
5. The wheel installed (not editable) in a fresh venv with nothing but its core
   dependencies; examples/quickstart.py runs there from a directory outside the repository,
   so the checkout's own package cannot be imported by accident; ``pip check`` passes and
   the ``ratelimit`` command answers.
"""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from email.message import Message
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PIP = ["-m", "pip", "install", "-q", "--disable-pip-version-check"]


def run(*command: str | Path, cwd: Path | None = None) -> str:
    """Run ``command``; its output, or exit with it if it fails."""
    print("$", " ".join(str(part) for part in command), flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REDIS_URL")}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def venv(where: Path) -> Path:
    """A fresh venv (no system site-packages) at ``where``; its python."""
    run(sys.executable, "-m", "venv", where)
    return where / "bin" / "python"


def check(what: str, found: object, expected: object) -> None:
    if found != expected:
        sys.exit(f"{what}: found {found!r}, expected {expected!r}")
    print(f"ok: {what}")


def normalized(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def check_metadata(metadata: Message, project: dict[str, Any]) -> None:
    check("name", metadata["Name"], project["name"])
    check("version", metadata["Version"], project["version"])
    check("Requires-Python", metadata["Requires-Python"], project["requires-python"])
    required = metadata.get_all("Requires-Dist") or []
    core = {normalized(r) for r in required if "extra ==" not in r}
    check("runtime dependencies", core, {normalized(r) for r in project["dependencies"]})
    extras = set(metadata.get_all("Provides-Extra") or [])
    check("extras", extras, set(project["optional-dependencies"]))


def tracked_package_files() -> set[str]:
    listed = run("git", "-C", ROOT, "ls-files", "ratelimit").split()
    return {name for name in listed if (ROOT / name).is_file()}  # deleted, not committed


def check_contents(wheel: Path, sdist: Path) -> None:
    package = tracked_package_files()
    with zipfile.ZipFile(wheel) as archive:
        names = {n for n in archive.namelist() if ".dist-info/" not in n}
    missing, extra = package - names, names - package
    what = "the wheel holds the tracked files of ratelimit/, and only those"
    check(what, (missing, extra), (set(), set()))
    for needed in ("ratelimit/py.typed", "ratelimit/backends/redis/lua/sliding_log.lua"):
        check(f"the wheel holds {needed}", needed in names, True)
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        held = {name.removeprefix(f"{top}/") for name in archive.getnames()}
    wanted = package | {"pyproject.toml", "README.md", "PKG-INFO"}
    wanted |= {p.name for p in ROOT.glob("LICEN[CS]E*")}
    check("the sdist holds the package, pyproject.toml, README, LICENSE", wanted - held, set())


def main() -> None:
    started = time.monotonic()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    work = Path(tempfile.mkdtemp(prefix="check-dist-"))
    try:
        tools = venv(work / "tools")
        run(tools, *PIP, "build", "twine")
        dist = work / "dist"
        run(tools, "-m", "build", "--outdir", dist, ROOT)  # the sdist, then a wheel from it
        (wheel,) = dist.glob("*.whl")
        (sdist,) = dist.glob("*.tar.gz")
        print(run(tools, "-m", "twine", "check", "--strict", wheel, sdist), end="")
        with zipfile.ZipFile(wheel) as archive:
            (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
            check_metadata(email.message_from_bytes(archive.read(name)), project)
        check_contents(wheel, sdist)

        python = venv(work / "fresh")
        run(python, *PIP, wheel)  # the wheel, with its core dependencies only
        run(python, "-m", "pip", "check")
        outside = work / "outside"
        outside.mkdir()
        shutil.copy(ROOT / "examples" / "quickstart.py", outside)
        where = run(python, "-c", "import ratelimit; print(ratelimit.__file__)", cwd=outside)
        fresh = where.startswith(str(work / "fresh"))
        check("ratelimit is imported from the fresh venv", fresh, True)
        printed = run(python, "quickstart.py", cwd=outside)
        print(printed, end="")
        check("the quickstart shows a refusal", "refused by" in printed, True)
        run(work / "fresh" / "bin" / "ratelimit", "--help", cwd=outside)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"dist checked in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
