"""Everything that makes or reads allocation traces. Knows nothing of policies or the engine.

- :mod:`allocsim.traces.model` — the one in-memory :class:`Trace` type and :class:`TraceError`;
- :mod:`allocsim.traces.validate` — strict and lenient checking with one-line errors;
- :mod:`allocsim.traces.formats` — files in and out (native ``.npz`` / ``.csv`` / ``.jsonl``);
- :mod:`allocsim.traces.synth` — seeded generators of realistic workloads.
"""

from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, SIZE_UNKNOWN, Trace, TraceError

__all__ = ["NO_TAG", "OP_ALLOC", "OP_FREE", "SIZE_UNKNOWN", "Trace", "TraceError"]
