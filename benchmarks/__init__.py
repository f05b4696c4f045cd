"""The benchmarks that hold allocsim to its speed and memory targets, each run from a
checkout's top folder as ``python -m benchmarks.NAME`` (``--help`` for its options); what they
measured, and on what machine, is in docs/benchmarks.md.

- ``replay``, ``native``: the replay loop, Python and the native core, against their floors;
  bytes per event (``--memory``);
- ``big``: a 500-million-event trace, written a block at a time, loaded and replayed in the
  native core;
- ``capacity``, ``tune``, ``sweep``, ``report``: min-capacity, tune, a sweep grid, the HTML
  report on long traces;
- ``formats``, ``xla_dump``: reading trace files and XLA dump folders;
- ``jax_recorder``, ``torch_meta``, ``xla_gpu``: what recording costs the recorded program,
  and a deviceless XLA:GPU compile.
"""
