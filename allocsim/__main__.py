"""``python -m allocsim ...``: the same command line as the ``allocsim`` script."""

from allocsim.sim.cli import main

raise SystemExit(main())
