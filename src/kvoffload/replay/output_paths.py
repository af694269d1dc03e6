"""Where a replay writes its report and plot, checked before the replay runs.

A replay can take minutes; a report directory that cannot be written, or a plot
path that names nothing drawable, must stop it at the start, not lose its results
at the end. Each check raises `ValueError` naming the option, the path and why.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

REPORT_FILES = ("results.jsonl", "table.txt", "hit_ratio.png")
PLOT_NAME = "hit_ratio.png"


def prepare_report_dir(directory: Path, option: str = "--report-dir") -> Path:
    """Create `directory` if needed and check that its report files can be written."""
    _writable_dir(directory, option)
    for name in REPORT_FILES:
        path = directory / name
        if path.exists() and not path.is_file():
            raise ValueError(f"{option} {directory}: {path} is not a regular file")
    return directory


def resolve_plot_path(path: Path, option: str = "--plot") -> Path:
    """The PNG file that `path` names: `path` itself (ending in .png), or
    `hit_ratio.png` inside it when it is a directory. Its directory is created
    and checked, and matplotlib must be installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"{option} needs matplotlib: pip install 'kvoffload[plots]'")
    if path.is_dir():
        path = path / PLOT_NAME
    elif path.suffix.lower() != ".png":
        raise ValueError(
            f"{option} {path}: expected a directory or a file ending in .png"
        )
    if path.exists() and not path.is_file():
        raise ValueError(f"{option} {path}: not a regular file")
    _writable_dir(path.parent, option)
    return path


def _writable_dir(directory: Path, option: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # Whether a file can be created there, the one test that holds for every
        # file system, user and mount option.
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise ValueError(
            f"{option} {directory}: cannot write there ({exc.strerror or exc})"
        ) from None
