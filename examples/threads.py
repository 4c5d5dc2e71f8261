"""The sync API in threads: plain functions, one limiter shared by every thread, a with
block, and concurrency slots.

    python examples/threads.py            # memory://, or Redis with REDIS_URL set
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from ratelimit import RateLimitExceeded
from ratelimit.sync import RateLimit

rl = RateLimit.from_url(os.environ.get("REDIS_URL", "memory://"), f"threads-{os.getpid()}")


@rl.limit("user:5/m")
def search(user: str, q: str) -> str:  # still a plain def
    return f"results for {q!r}"


def main() -> None:
    admitted = {"ann": 0, "bob": 0}
    lock = threading.Lock()

    def browse(user: str) -> None:
        for n in range(4):
            try:
                search(user, f"query {n}")
            except RateLimitExceeded:
                continue
            with lock:
                admitted[user] += 1

    threads = [threading.Thread(target=browse, args=(u,)) for u in ("ann", "ann", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"8 searches by ann in 2 threads: {admitted['ann']} admitted under user:5/m")
    print(f"4 searches by bob: {admitted['bob']} admitted")

    export = rl.limit("2/m", key="export")
    for n in range(1, 4):
        decision = export.decide()
        print(f"export #{n}: {'admitted' if decision.allowed else 'refused'}")

    at_once = 0
    most = 0

    @rl.concurrency("2", key="reports")
    def report() -> None:
        nonlocal at_once, most
        with lock:
            at_once += 1
            most = max(most, at_once)
        time.sleep(0.05)  # the work itself
        with lock:
            at_once -= 1

    def run_report() -> None:
        with contextlib.suppress(RateLimitExceeded):  # the third at once is refused
            report()

    workers = [threading.Thread(target=run_report) for _ in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(f"reports: at most {most} at once under a concurrency limit of 2")
    rl.close()


if __name__ == "__main__":
    main()
