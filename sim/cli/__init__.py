"""The ``allocsim`` command line: every command's parser beside its handler."""

from allocsim.sim.cli.main import main

__all__ = ["main"]
