"""Print the path of the newest Python on this machine that is newer than the one running
this, and can make a venv with pip; print nothing if there is none.

    newest=$(python3 .ci/newest_python.py)

Looks for ``python3.N`` on PATH (a pyenv shim of a version not selected fails to run, and is
passed over), under pyenv's versions, and in /usr/bin and /usr/local/bin.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PROBE = "import sys, venv, ensurepip; print('%d.%d' % sys.version_info[:2])"


def candidates() -> list[str]:
    found = [shutil.which(f"python3.{minor}") for minor in range(sys.version_info[1] + 1, 30)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found += [str(p) for p in (pyenv / "versions").glob("*/bin/python3.*")]
    for place in (Path("/usr/bin"), Path("/usr/local/bin")):
        found += [str(p) for p in place.glob("python3.*")]
    return sorted({p for p in found if p and re.fullmatch(r"python3\.\d+", Path(p).name)})


def version(python: str) -> tuple[int, int] | None:
    """``python``'s version if it runs and can make a venv with pip."""
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    major, minor = done.stdout.strip().split(".")
    return int(major), int(minor)


def main() -> None:
    found = {(v, path) for path in candidates() if (v := version(path)) is not None}
    newer = [(v, path) for v, path in found if v > sys.version_info[:2]]
    if newer:
        print(max(newer)[1])


if __name__ == "__main__":
    main()
