"""How long ``import ratelimit`` takes, beside the peers' imports, each in a fresh
interpreter, alternating, so that one run measures all of them on the same machine.

    python bench/import_time.py [--rounds 15]

Each round starts one ``python -c`` per contender that times its import with
``time.perf_counter`` (the interpreter's own start-up left out) and prints it, with byte
code written and a first round left out (an installed package's is compiled at install:
a checkout under ``PYTHONDONTWRITEBYTECODE`` would compile every module each time); the table
gives the median and the fastest round, and ours as a multiple of ``limits``'. A second row
of ours times the import and the first ``rl.limit("user:5/m")`` (the rule grammar, which
loads pyparsing, comes with the first rule parsed). Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys

CONTENDERS = {
    "ratelimit": "import ratelimit",
    "ratelimit + first limit()": (
        "import ratelimit\nratelimit.RateLimit.from_url('memory://').limit('user:5/m')"
    ),
    "limits": "import limits",
    "limits.aio": "import limits.aio.strategies",
    "pyrate_limiter": "import pyrate_limiter",
    "throttled": "import throttled",
    "aiolimiter": "import aiolimiter",
}
TIMED = "import time\nstarted = time.perf_counter()\n{code}\nprint(time.perf_counter() - started)"


def installed(code: str) -> bool:
    module = code.split()[1].split(".")[0]
    return importlib.util.find_spec(module) is not None


def once(code: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-c", TIMED.format(code=code)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    contenders = {name: code for name, code in CONTENDERS.items() if installed(code)}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for code in contenders.values():  # byte code written, caches warm: left out
        once(code)
    for _ in range(args.rounds):
        for name, code in contenders.items():
            times[name].append(once(code))
    base = statistics.median(times["limits"]) if "limits" in times else None
    print(f"{args.rounds} rounds, Python {sys.version.split()[0]}\n")
    print("| import | median ms | fastest ms | ÷ limits |")
    print("|---|---:|---:|---:|")
    for name, measured in times.items():
        median = statistics.median(measured)
        ratio = f"{median / base:.2f}" if base else "-"
        print(f"| {name} | {median * 1000:.1f} | {min(measured) * 1000:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
