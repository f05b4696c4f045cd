"""Fidelity: does a model make the decisions the real allocator made? One module per source of
truth — ``pytorch`` (a PyTorch snapshot; ``allocsim fidelity``, over ``recording``, ``device``,
``replay``, ``match``, ``report``, ``settings``, ``start``, ``simulate`` and ``oom``), ``bfc``
(TensorFlow/JAX profiles, starting mid-run by ``bfc_start`` and ``bfc_start_refine``), ``xla``
(XLA's own buffer assignment in a dump) and ``tpu`` (a TPU runtime's records). This package
imports nothing itself: import the module you need."""
