"""The `kvoffload` command itself (its subcommands have their own tests)."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from kvoffload.cli import main


def test_version_prints_the_installed_version_and_exits_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvoffload {version('kvoffload')}"
