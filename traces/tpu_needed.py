"""What a TPU program cannot do without: its trace with idle executables given up.

The TPU runtime keeps a loaded executable's generated code in HBM, and reserves its scratch,
while there is room; when a buffer needs the room it gives an idle executable's code and
scratch up, and loads them again at that executable's next call. Read on a v5e (JAX 0.10.2,
libtpu 0.0.42.1; tests/data/tpu/programs): four programs whose peak in use fell between calls
(a new batch placed while the last one was still held) ran with 256 KiB less than their peak in
use + scratch, their peak in use falling by part or all of an idle executable's code; two whose
peak fell inside a call did not. So whether a program runs in ``C`` bytes is not decided by the
trace as the runtime holds it with room (:mod:`allocsim.traces.record.tpu_program`: code from
the first call on, the largest scratch throughout; what ``peak_bytes_in_use`` shows) but by this
view of it: each executable's code and scratch as buffers held through each of its calls only.
The ``tpu`` policy fails a request only when its free total is short (it compacts), so this
view's peak is what HBM must hold.

:func:`needed_view` makes it from a trace whose ``xla_tpu`` metadata lists each call's events
(``calls``: executable index, first event, end event) and each executable's code buffer;
other traces have no such view (:func:`has_needed_view`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace

__all__ = ["has_needed_view", "needed_view"]


def _facts(trace: Trace) -> dict[str, Any] | None:
    facts = trace.metadata.get("xla_tpu")
    if not isinstance(facts, dict) or facts.get("view") == "needed":
        return None
    if not isinstance(facts.get("calls"), list) or not isinstance(facts.get("executables"),
                                                                   list):
        return None
    return facts


def has_needed_view(trace: Trace) -> bool:
    """Whether ``trace`` says which events are each executable's calls."""
    return _facts(trace) is not None


def needed_view(trace: Trace) -> Trace:
    """``trace`` with each executable's code and scratch held through its calls only (module
    docstring); the trace itself when it does not say where its calls are."""
    facts = _facts(trace)
    if facts is None:
        return trace
    executables = facts["executables"]
    code_ids = {int(e["code_buffer"]) for e in executables if int(e.get("code_buffer", -1)) >= 0}
    op, ident, size, tag = trace.op, trace.id, trace.size, trace.tag
    time = trace.time_ns
    tags = list(trace.tags or [])
    before: dict[int, list[tuple[int, int, int]]] = {}   # event -> (size, id, tag) to allocate
    after: dict[int, list[tuple[int, int, int]]] = {}    # event -> (size, id, tag) to free
    next_id = int(ident.max()) + 1 if len(ident) else 0
    for executable, first, end in facts["calls"]:
        facts_of = executables[int(executable)]
        for nbytes, what in ((int(facts_of.get("code_bytes", 0)), "generated code"),
                             (int(facts_of.get("scratch_bytes", 0)), "scratch")):
            if nbytes <= 0:
                continue
            tags.append(f"{facts_of['name']}: {what} (held through the call)")
            entry = (nbytes, next_id, len(tags) - 1)
            next_id += 1
            before.setdefault(int(first), []).append(entry)
            after.setdefault(max(int(end) - 1, int(first)), []).append(entry)
    rows: list[tuple[int, int, int, int, int]] = []
    n = len(op)
    for i in range(n + 1):
        for nbytes, new_id, new_tag in before.get(i, ()):
            rows.append((int(time[min(i, n - 1)]) if n else 0, OP_ALLOC, new_id, nbytes,
                         new_tag))
        if i == n:
            break
        if int(ident[i]) not in code_ids:
            rows.append((int(time[i]), int(op[i]), int(ident[i]), int(size[i]),
                         int(tag[i]) if tag is not None else -1))
        for nbytes, new_id, new_tag in after.get(i, ()):
            rows.append((int(time[i]), OP_FREE, new_id, nbytes, new_tag))
    table = np.array(rows, dtype=np.int64).reshape(-1, 5)
    metadata = dict(trace.metadata)
    metadata["xla_tpu"] = {**facts, "view": "needed", "scratch_bytes": 0,
                           "view_note": "code and scratch held through each call only "
                                        "(allocsim.traces.tpu_needed)"}
    return Trace.from_columns(table[:, 0], table[:, 1].astype(np.int8), table[:, 2],
                              table[:, 3], tag=table[:, 4].astype(np.int32), tags=tags,
                              **metadata)
