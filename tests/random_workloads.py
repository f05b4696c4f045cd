"""Random traces that reach every branch a policy has: small requests that split a chunk,
whole multiples of the 2 MiB growth chunk, requests of several chunks, a few of size 0, two
streams, frees in random order and a few frees of ids never allocated. Shared by the tests that
replay whole runs (reference cycles, rule edges)."""

from __future__ import annotations

import numpy as np

from allocsim.traces.model import Trace

MiB = 1 << 20


def random_events(seed: int, n: int = 3000) -> Trace:
    """``n`` events of the mix above, seeded."""
    rng = np.random.default_rng(seed)
    events: list[tuple] = []
    live: list[tuple[int, int]] = []
    next_id = 1
    for time in range(n):
        roll = rng.random()
        if roll < 0.01:
            events.append((time, "free", 10**9 + time, None))
        elif live and (roll < 0.45 or len(live) > 60):
            buffer, size = live.pop(int(rng.integers(len(live))))
            events.append((time, "free", buffer, size))
        else:
            kind = rng.integers(5)
            size = (0 if kind == 0 and rng.random() < 0.1
                    else int(rng.integers(1, 4096)) if kind <= 1
                    else int(rng.integers(4096, 3 * MiB)) if kind == 2
                    else int(rng.integers(1, 4)) * 2 * MiB if kind == 3
                    else int(rng.integers(3 * MiB, 9 * MiB)))
            events.append((time, "alloc", next_id, size, int(rng.integers(2))))
            live.append((next_id, size))
            next_id += 1
    return Trace.from_events(events, name=f"random-{seed}")
