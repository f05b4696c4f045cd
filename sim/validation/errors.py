"""The validator's one-line errors, and the CLI's one-line convention for any error.

:class:`ValidatorError` is a mistake in what the user asked the validator (or calibration) to
do, or a limitation of the machine it runs on; :class:`NoGPUError` says a GPU backend found no
GPU. Both are :class:`~allocsim.errors.UserInputError`, so the command line prints them as
``allocsim: error: ...`` and exits 2.
"""

from __future__ import annotations

from allocsim.errors import UserInputError


class ValidatorError(UserInputError):
    """A mistake in what the user asked the validator to do; ``str()`` is one line.

    A ValueError so that the allocsim CLI prints it as ``allocsim: error: ...`` and exits 2.
    """


class NoGPUError(ValidatorError):
    """No CUDA device is visible to CuPy (or torch): only ``--backend host`` can run."""


def one_line(err: BaseException | str) -> str:
    """An error's message on one line (the CLI's convention), its type if it has none."""
    text = str(err).strip()
    if not text and isinstance(err, BaseException):
        text = type(err).__name__
    return " ".join(text.split())

