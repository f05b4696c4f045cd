"""Recording PyTorch programs: on the meta device at full size with no GPU (``meta`` over
``meta_modes``, ``meta_cuda``, ``meta_accelerator``, ``meta_targets``, ``meta_autocast``;
``meta_script`` runs a script under it) or with the PyTorch profiler (``profiler``). This
package imports nothing itself (not even torch): import the module you need."""
