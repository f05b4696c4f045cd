"""PyTorch's CUDA caching allocator, rule for rule: the policy (``caching``), its settings and
size rules (``settings``), blocks and free lists (``blocks``, ``records``), the miss path
(``oom``), expandable segments (``expandable``), its counters (``stats``) and its state in and
out (``snapshot``). This package imports nothing itself: import the module you need."""
