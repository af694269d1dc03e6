"""The trees a reset of the file tier leaves: `ChunkFiles.remove_all` renames the
fingerprint's directory aside, to a hidden `.<fingerprint>.<id>.deleting` next
to it, and deletes that on a daemon thread; what a process killed meanwhile left
of such trees is deleted at the next start (`remove_leftover_trees`).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import uuid
from collections.abc import Sequence

DELETING_SUFFIX = ".deleting"
"""A fingerprint directory renamed aside by `remove_all`, being deleted."""


def aside_path(directory: str, fingerprint: str) -> str:
    """A new name, next to `directory`, to rename it to and delete it under."""
    name = f".{fingerprint}.{uuid.uuid4().hex}{DELETING_SUFFIX}"
    return os.path.join(os.path.dirname(directory), name)


def delete_trees(paths: Sequence[str]) -> None:
    """Delete directory trees on a daemon thread: what is left of them when the
    process ends, `remove_leftover_trees` deletes at the next start."""

    def run() -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)

    if paths:
        threading.Thread(target=run, name="kvoffload-file-delete", daemon=True).start()


def remove_leftover_trees(directory: str, fingerprint: str) -> None:
    """Delete, in the background, the trees set aside from `directory` (of
    `fingerprint` only) that a process ended before it finished deleting."""
    root = os.path.dirname(directory)
    escaped, suffix = re.escape(fingerprint), re.escape(DELETING_SUFFIX)
    name = re.compile(rf"\.{escaped}\.[0-9a-f]{{32}}{suffix}")
    try:
        entries = os.listdir(root)
    except OSError:
        return
    delete_trees([os.path.join(root, e) for e in entries if name.fullmatch(e)])
