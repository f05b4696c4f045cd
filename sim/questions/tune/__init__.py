"""``allocsim tune``: the setting to paste, for a job and a card. ``recommend`` answers (over
``space``: what may be set, per framework; ``search``: the search; ``evidence``: how far to
trust the answer; ``explain``: which rule makes the difference), ``share`` the per-job limits
for several jobs on one card. This package imports nothing itself: import the module you
need."""
