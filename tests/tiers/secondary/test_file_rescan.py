"""Rescanner: a scan that was running when the directory was reset reports nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from kvoffload.tiers.secondary.executor import JobExecutor
from kvoffload.tiers.secondary.file_rescan import Rescanner
from kvoffload.tiers.secondary.file_scan import ScannedFile
from tests.tiers.secondary.secondary_support import key


class SlowFiles:
    """A directory whose scan lists `listed`, then waits for `release`."""

    directory = "/nowhere"

    def __init__(self) -> None:
        self.listed = [ScannedFile(key(1), 100, 1.0)]
        self.started = threading.Event()
        self.release = threading.Event()

    def scan(self, remove_abandoned: bool = False) -> Iterator[ScannedFile]:
        self.started.set()
        assert self.release.wait(10.0)
        yield from self.listed


def test_a_scan_running_across_a_reset_reports_nothing() -> None:
    """Scenario: a rescan has listed the old directory's chunk 1 when the tier
    resets (the directory is emptied): its findings must not bring chunk 1
    back into the index; the next scan reports what is there afterwards."""
    files = SlowFiles()
    executor = JobExecutor("rescan-test", 1)
    rescanner = Rescanner(files, executor, 0.0, [])  # type: ignore[arg-type]
    rescanner.poll()  # starts the scan
    assert files.started.wait(10.0)
    rescanner.reset()
    files.release.set()
    executor.drain()
    assert rescanner.poll() == ([], [], [])  # and starts the next scan
    executor.drain()
    assert [f.key for f in rescanner.poll().found] == [key(1)]
    executor.shutdown()
