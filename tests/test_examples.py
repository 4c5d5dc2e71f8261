"""The examples run, on memory:// and on a real Redis, and say what they should."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
EXPECTED = {
    "quickstart.py": "ping 6: refused by 5/s",
    "failed_logins.py": "ann wrong #4: locked out by username:3/15m",
    "selector_sources.py": "bad_kittie #2: refused by username:3/m (key 'cats')",
    "context_manager.py": "vova must wait 300 s",
    "command_engine.py": "vova: refused by user:3/10s",
    "counters.py": "synced mode: 100 of 150 admitted under 100/m",
    "metrics.py": "  3  api denied by ip:5/m",
    "pipelining.py": "auto_pipeline=False: 1000 of 2000",
    "event_loops.py": "run 2: 40 of 300 admitted, 100 in all under 100/h",
    "settings.py": "admin: 3 of 5 admitted under 3/m",
    "web_app.py": "POST /login ann #4: 429",
    "flask_app.py": "POST /login ann #4: 429",
    "django_app.py": "POST /login ann #4: 429",
    "service_client.py": "envoy ShouldRateLimit #3: OVER_LIMIT",
    "bursts.py": "10/s burst 30: 129 of 600 calls in 10 s",
    "concurrency.py": "queued: 8 exports ran, at most 2 at once under user:2",
    "llm_tokens.py": "call 5: refused by api_key:2000 tokens/m",
    "tiers.py": "acme, raised: 4 of 6 admitted; refused by apikey:8/m (override)",
    "rolling_rules.py": "bob: old new old 429 429 429",
    "threads.py": "8 searches by ann in 2 threads: 5 admitted under user:5/m",
    "reserved_slots.py": "critical:  2 of 20 got a slot, 10 held",
    "local_fallback.py": "store down: [25, 25, 25, 25] admitted of 60 each, 100 in all",
    "http_delay.py": "12 at once on ip:4/s, delay=1.5: 4 admitted at once",
    "penalties.py": "refused, held 3600 s, held 3590 s",
    "leases.py": "never more than 5000",
}
ON_MEMORY = {
    **EXPECTED,
    "command_engine.py": "the command engine needs Redis",
    "counters.py": "after a refund: 1.5",
    "pipelining.py": "memory://: 1000 of 2000 admitted",
}


def run(example: Path, redis_url: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if redis_url:
        env["REDIS_URL"] = redis_url
    done = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_example_is_checked() -> None:
    assert {e.name for e in EXAMPLES} == set(EXPECTED)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_example_on_memory(example: Path) -> None:
    assert ON_MEMORY[example.name] in run(example, None)


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_example_on_redis(example: Path, redis_url: str) -> None:
    assert EXPECTED[example.name] in run(example, redis_url)


def test_the_readme_example_prints_what_the_readme_says() -> None:
    """The README's "One example" and the output shown under it, a refusal included (the
    seconds of ``retry_after`` left out: they depend on how fast the calls ran)."""
    section = (ROOT / "README.md").read_text().split("## One example\n", 1)[1].split("\n## ")[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr

    def seconds_left_out(text: str) -> str:
        return re.sub(r"retry in \d+\.\d+ s", "retry in ... s", text)

    assert seconds_left_out(done.stdout) == seconds_left_out(shown)
    assert "refused by" in shown


def test_the_docs_home_shows_the_readme_example() -> None:
    """The docs site's home page shows the README's example and its output, word for word."""

    def example(page: str) -> str:
        return (ROOT / page).read_text().split("## One example\n", 1)[1].split("\n## ")[0]

    assert example("docs/index.md") == example("README.md")
