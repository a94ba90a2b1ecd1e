"""What a command line usage error must look like: exit 2, one stderr line, no traceback."""

from __future__ import annotations

import pytest

from attnscope.cli import main


def usage_error(capsys: pytest.CaptureFixture[str], command: str, argv: list[str]) -> str:
    """Run ``attnscope COMMAND ARGV...`` in this process; the one stderr line it printed."""
    try:
        code = main([command, *argv])
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    # the command's name, not argparse's list of commands
    assert err.startswith(f"attnscope {command}: error: "), err
    assert "Traceback" not in err
    return err
