"""The error boundary between a user's mistake and a bug in allocsim.

Code that judges input — a file, a policy spec, a size, a device profile, an option — raises
:class:`UserInputError` (or a subclass: ``TraceError``, ``PolicySpecError``, ...) with one line
that names the file, the event index and the problem where there is one. The command line
prints those as ``allocsim: error: ...`` and exits 2. Anything else that escapes is a bug in
allocsim: it keeps its traceback, so an internal consistency error is never shown to a user as
their fault.

This module imports nothing, so every room (the policies included) may raise it.
"""


class UserInputError(ValueError):
    """A mistake in what the user gave; its message is the one line the user sees.

    A ``ValueError`` so that code catching ``ValueError`` around parsing keeps working."""
