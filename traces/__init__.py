"""Everything that makes or reads allocation traces. Knows nothing of policies or the engine:
it imports neither :mod:`allocsim.policies` nor :mod:`allocsim.sim`.

- :mod:`allocsim.traces.model` — the one in-memory :class:`Trace` type and :class:`TraceError`;
- :mod:`allocsim.traces.validate` — strict and lenient checking with one-line errors;
- :mod:`allocsim.traces.formats` — files in and out: native ``.npz`` / ``.csv`` / ``.jsonl``
  and importers of other tools' files (PyTorch snapshot and profiler, CuPy hook log, RMM CSV,
  malloc-lab), each chosen by content;
- :mod:`allocsim.traces.record` — recorders that capture a trace from a running program;
- :mod:`allocsim.traces.synth` — seeded generators of realistic workloads;
- :mod:`allocsim.traces.summary` — facts about one trace, without a replay (``allocsim info``);
- :mod:`allocsim.traces.bundled` — the sample traces shipped inside the package.
"""

from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, SIZE_UNKNOWN, Trace, TraceError

__all__ = ["NO_TAG", "OP_ALLOC", "OP_FREE", "SIZE_UNKNOWN", "Trace", "TraceError"]
