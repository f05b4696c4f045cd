"""``python -m allocsim.sim.cli ...``: the command line (used by the prepared GPU script)."""

from allocsim.sim.cli.main import main

raise SystemExit(main())
