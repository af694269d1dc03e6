"""Privacy of the file tier: other users never read cached KV, whatever the umask.

Every directory the tier makes is 0700 and every file it makes (chunk files,
temporary files, the start-up probe) 0600; with `file_mode: "0660"`, 0770 and
0660 for engines of several users sharing a group.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload.tiers.secondary import ArrayChunkBuffer, file_access
from tests.tiers.secondary.secondary_support import FINGERPRINT, key
from tests.tiers.secondary.test_file_tier import FILE_SIZE, store, tier_at


@pytest.fixture(params=[0o000, 0o022, 0o077], ids=oct)
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process umask during the test (0: `open` and `mkdir` take their
    mode argument as it is)."""
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def modes_under(root: Path) -> dict[str, int]:
    """Permission bits of every directory and file under `root`, by path;
    directories' paths end with `/`."""
    modes = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            shown = os.path.relpath(path, root) + ("/" if name in dirnames else "")
            modes[shown] = stat.S_IMODE(os.lstat(path).st_mode)
    return modes


def record_temporary_modes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Modes of the files being written, seen mid-write (temporary files)."""
    seen: list[int] = []
    real_pwritev = os.pwritev

    def pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    return seen


def test_every_directory_is_0700_and_every_file_0600_whatever_the_umask(
    tmp_path: Path,
    buffer: ArrayChunkBuffer,
    umask: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scenario: a tier whose directory does not exist yet (two levels of it)
    stores chunks of two groups, under umask 0, 022 or 077: the directories it
    made, the chunk files and the temporary files they were written as have
    exactly the private modes."""
    root = tmp_path / "made" / "kv"
    temporaries = record_temporary_modes(monkeypatch)
    tier = tier_at(root, buffer)
    store(tier, buffer, [1, 2, 3])
    tier.shutdown()
    modes = modes_under(tmp_path)
    directories = {p: m for p, m in modes.items() if p.endswith("/")}
    files = {p: m for p, m in modes.items() if not p.endswith("/")}
    # Three chunk files and the directory's ledger (`file_ledger`).
    assert len(files) == 4 and len(directories) >= 4
    assert set(directories.values()) == {0o700}, directories
    assert set(files.values()) == {0o600}, files
    assert temporaries and set(temporaries) == {0o600}


def test_the_start_up_probe_is_private(
    tmp_path: Path, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: the file start-up writes to learn that the directory is
    writable is asked for with the private mode too."""
    asked: list[int] = []
    real_open = os.open

    def open_(path: str, flags: int, mode: int = 0o777, **kw: int) -> int:
        if ".probe" in os.path.basename(path):
            asked.append(mode)
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", open_)
    tier_at(tmp_path, buffer).shutdown()
    assert asked == [0o600]


def test_a_directory_and_files_an_older_version_left_open_are_made_private(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the directory of a version that made 0755 directories and 0644
    files: at start the tier closes the fingerprint's directory (no other user
    gets in at all), and a file it reuses for a new chunk becomes 0600."""
    old = tier_at(tmp_path, buffer, capacity=FILE_SIZE)
    store(old, buffer, [1])
    old.shutdown()
    directory = tmp_path / FINGERPRINT
    os.chmod(directory, 0o755)
    os.chmod(old.chunk_path(key(1)), 0o644)
    tier = tier_at(tmp_path, buffer, capacity=FILE_SIZE)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    store(tier, buffer, [2])  # evicts chunk 1 and reuses its file
    assert tier.get_stats().evictions == 1
    assert stat.S_IMODE(os.stat(tier.chunk_path(key(2))).st_mode) == 0o600
    tier.shutdown()


def test_the_directory_a_reset_makes_again_is_private(
    tmp_path: Path, buffer: ArrayChunkBuffer, umask: int
) -> None:
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, [1])
    tier.reset_cache()
    assert stat.S_IMODE((tmp_path / FINGERPRINT).stat().st_mode) == 0o700
    tier.shutdown()


def test_file_mode_0660_shares_with_the_group_and_keeps_its_set_group_id(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: engines of several users in one group share a directory an
    administrator made set-group-ID (2770): with `file_mode: "0660"` the
    tier's directories are 0770 and keep that bit (so files get the group),
    its files 0660, even under umask 077."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o2770)
    before = os.umask(0o077)
    try:
        tier = tier_at(shared, buffer, file_mode="0660")
        store(tier, buffer, [1])
        tier.shutdown()
    finally:
        os.umask(before)
    fingerprint = (shared / FINGERPRINT).stat().st_mode
    assert stat.S_IMODE(fingerprint) == 0o2770
    subdirectory = Path(tier.chunk_path(key(1))).parent.stat().st_mode
    assert stat.S_IMODE(subdirectory) == 0o2770
    assert stat.S_IMODE(os.stat(tier.chunk_path(key(1))).st_mode) == 0o660


def test_an_existing_directory_of_the_user_is_left_as_it_is_above_the_tiers_own(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """The configured `path` may be a directory the operator made (a mount
    point, say): the tier closes its own directory in it, not that one."""
    os.chmod(tmp_path, 0o755)
    tier = tier_at(tmp_path, buffer)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / FINGERPRINT).stat().st_mode) == 0o700
    tier.shutdown()


def test_a_file_system_refusing_chmod_still_gets_nothing_more_open_than_asked(
    tmp_path: Path,
    buffer: ArrayChunkBuffer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: a file system where `chmod` fails (vfat, some network ones),
    under umask 0: the tier starts and stores, one warning says so, and what it
    made is no more open than the modes it asked `mkdir` and `open` for."""

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refused)
    monkeypatch.setattr(os, "fchmod", refused)
    monkeypatch.setattr(file_access, "_warned", False)
    before = os.umask(0)
    try:
        tier = tier_at(tmp_path / "kv", buffer)
        store(tier, buffer, [1, 2])
        tier.shutdown()
    finally:
        os.umask(before)
    modes = modes_under(tmp_path)
    assert modes and all(
        mode == (0o700 if path.endswith("/") else 0o600) for path, mode in modes.items()
    ), modes
    warnings = [r for r in caplog.records if "cannot set mode" in r.getMessage()]
    assert len(warnings) == 1
