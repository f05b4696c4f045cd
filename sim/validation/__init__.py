"""Validation on real memory: the same policy objects replayed against host or GPU memory
(CuPy, torch), byte patterns that catch overlaps, the CUDA virtual-memory device, calibration of
a device profile. The front door is :mod:`allocsim.sim.validation.validator`
(``validate``, ``validate_results``); :mod:`allocsim.sim.validation.calibrate` measures a GPU
into a device profile."""
