"""The check the bad-input tests share: ``allocsim ARGV`` refused in one line, exit 2."""

from __future__ import annotations

from typing import Any

from allocsim.sim.cli.main import main


def refused(capsys: Any, *argv: Any) -> str:
    """Run ``allocsim ARGV``; assert one ``allocsim: error:`` line, no traceback and exit 2
    (argparse's own refusals included); return the line."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("allocsim: error:"), err
    assert "Traceback" not in err
    return lines[0]
