"""``python -m allocsim ...``: the same command line as the ``allocsim`` script."""

from allocsim.command import main

raise SystemExit(main())
