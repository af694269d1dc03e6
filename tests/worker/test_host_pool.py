"""The host pool: slots as memory, and one pool seen by two processes."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from kvoffload.worker.base import ChunkBuffer
from kvoffload.worker.cpu_worker import CpuTransferWorker
from kvoffload.worker.factory import create_data_plane
from kvoffload.worker.geometry import GroupGeometry, PoolGeometry
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import GroupSpec, describe_kv_caches

from .kv_layouts import GROUPS, LAYOUTS, Tensors, block_bytes, make_caches
from .support import STORE, data_plane, run_job

GEOMETRY = PoolGeometry.of([GroupGeometry(0, 2, 1024, 2), GroupGeometry(1, 1, 512, 4)])


@pytest.fixture
def name() -> Iterator[str]:
    name = f"kvoffload-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    (Path("/dev/shm") / name).unlink(missing_ok=True)


def _child(code: str) -> str:
    """Run `code` in a fresh interpreter; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_slots_are_disjoint_writable_memory() -> None:
    with HostPool.create(GEOMETRY, 3) as pool:
        buffer: ChunkBuffer = pool
        assert buffer.slot_nbytes == 4096 and buffer.num_slots == 3
        assert buffer.chunk_nbytes(1) == 2048
        buffer.slot_view(1)[:] = b"\x07" * 4096
        assert bytes(buffer.slot_view(0)) == bytes(4096)
        assert bytes(buffer.slot_view(2)) == bytes(4096)
        assert bytes(pool.array[4096:8192]) == b"\x07" * 4096
        with pytest.raises(IndexError):
            buffer.slot_view(3)


def test_second_process_attaches_by_name_without_torch(name: str) -> None:
    """Scenario: the worker creates a named pool; the scheduler process attaches
    to it, reads what the worker wrote and writes a slot the worker then sees."""
    with HostPool.create(GEOMETRY, 3, name=name) as pool:
        pool.slot_view(2)[:5] = b"hello"
        out = _child(
            "import sys\n"
            "from kvoffload.worker import HostPool, GroupGeometry, PoolGeometry\n"
            "g = PoolGeometry.of([GroupGeometry(0, 2, 1024, 2), GroupGeometry(1, 1, 512, 4)])\n"
            f"p = HostPool.attach({name!r}, g, 3)\n"
            "print(bytes(p.slot_view(2)[:5]).decode(), 'torch' in sys.modules)\n"
            "p.slot_view(0)[:5] = b'world'\n"
            "p.close()\n"
        )
        assert out == "hello False"
        assert bytes(pool.slot_view(0)[:5]) == b"world"
        path = pool.path
        assert path is not None and path.exists()
    assert not path.exists()


def test_attacher_sees_chunks_the_worker_stored(name: str) -> None:
    """A store by the worker is readable, byte for byte, in another process."""
    torch.manual_seed(0)
    layout = LAYOUTS[0]
    caches = make_caches(layout, torch.bfloat16, torch.device("cpu"), GROUPS[:1])
    spec = GroupSpec(0, GROUPS[0].layers, GROUPS[0].num_blocks, 1)
    _, pool, worker = create_data_plane(caches, [spec], 1 << 20, pool_name=name)
    try:
        assert run_job(worker, 1, STORE, (0, [5], [3])).success
        nbytes = pool.chunk_nbytes(0)
        out = _child(
            "from kvoffload.worker import HostPool\n"
            f"p = HostPool.attach({name!r})\n"
            f"print(bytes(p.slot_view(3)[:{nbytes}]).hex())\n"
        )
    finally:
        worker.shutdown()
        pool.close()
    expected = block_bytes(layout, caches, GROUPS[0], 5).numpy().tobytes()
    assert bytes.fromhex(out) == expected


def test_attacher_reads_the_kv_layout_the_worker_registered(name: str) -> None:
    """The scheduler, which names chunks, learns from the pool how the worker's
    KV bytes are arranged: the fingerprint of the tensors' layout."""
    caches = make_caches(LAYOUTS[3], torch.float16, torch.device("cpu"), GROUPS[:1])
    spec = GroupSpec(0, GROUPS[0].layers, GROUPS[0].num_blocks, 2)
    layout, pool, worker = create_data_plane(caches, [spec], 1 << 20, pool_name=name)
    try:
        with HostPool.attach(name) as attached:
            assert attached.layout == layout.fingerprint
            assert layout.fingerprint == describe_kv_caches(caches, [spec]).fingerprint
    finally:
        worker.shutdown()
        pool.close()
    with pytest.raises(ValueError, match="layout"):
        HostPool.create(GEOMETRY, 1, layout="x" * 33)


def test_attach_rejects_a_different_geometry_or_slot_count(name: str) -> None:
    other = PoolGeometry.of([GroupGeometry(0, 2, 1024, 4)])
    with HostPool.create(GEOMETRY, 3, name=name):
        with pytest.raises(ValueError, match="geometry"):
            HostPool.attach(name, other)
        with pytest.raises(ValueError, match="slots"):
            HostPool.attach(name, GEOMETRY, 4)
        with HostPool.attach(name, GEOMETRY, 3) as attached:
            assert attached.geometry == GEOMETRY
            assert attached.path is not None
        assert attached.path.exists()  # only the creator removes the file


def test_attach_rejects_a_truncated_or_foreign_file(name: str) -> None:
    with HostPool.create(GEOMETRY, 3, name=name) as pool:
        assert pool.path is not None
        os.truncate(pool.path, 4096 + 100)
        with pytest.raises(ValueError, match="bytes"):
            HostPool.attach(name)
    foreign = Path("/dev/shm") / name
    foreign.write_bytes(b"not a pool" * 1000)
    with pytest.raises(ValueError, match="not a kvoffload host pool"):
        HostPool.attach(name)


def test_create_refuses_an_existing_name_unless_told(name: str) -> None:
    with HostPool.create(GEOMETRY, 1, name=name):
        with pytest.raises(FileExistsError):
            HostPool.create(GEOMETRY, 1, name=name)
        with HostPool.create(GEOMETRY, 2, name=name, exist_ok=True) as replaced:
            assert HostPool.attach(name).num_slots == replaced.num_slots == 2


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277], ids=oct)
def test_a_named_pool_is_0600_whatever_the_umask(name: str, umask: int) -> None:
    """The pool holds KV caches: never readable by other users (umask 0), and
    always readable and writable by this one, whose scheduler attaches to it
    (umask 0o277 would leave 0400)."""
    before = os.umask(umask)
    try:
        pool = HostPool.create(GEOMETRY, 1, name=name)
    finally:
        os.umask(before)
    with pool:
        assert pool.path is not None
        assert stat.S_IMODE(pool.path.stat().st_mode) == 0o600


@pytest.mark.parametrize("bad", ["", "a/b", ".hidden"])
def test_pool_names_are_plain_file_names(bad: str) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        HostPool.create(GEOMETRY, 1, name=bad)


def test_worker_refuses_a_pool_sized_for_another_layout() -> None:
    caches = make_caches(LAYOUTS[0], torch.float16, torch.device("cpu"), GROUPS[:1])
    spec = GroupSpec(0, GROUPS[0].layers, GROUPS[0].num_blocks, 1)
    layout = describe_kv_caches(caches, [spec])
    with (
        HostPool.create(GEOMETRY, 2) as pool,
        pytest.raises(ValueError, match="geometry"),
    ):
        CpuTransferWorker(caches, layout, pool)
    with data_plane(caches, [spec], 2) as (pool, worker):
        assert pool.geometry == layout.geometry
        assert run_job(worker, 1, STORE, (0, [0], [1])).success


def _one_group_caches() -> tuple[dict[str, Tensors], GroupSpec]:
    caches = make_caches(LAYOUTS[0], torch.bfloat16, torch.device("cpu"), GROUPS[:1])
    return caches, GroupSpec(0, GROUPS[0].layers, GROUPS[0].num_blocks, 1)


def test_a_budget_the_shm_dir_cannot_hold_names_the_setting_and_the_room(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: cpu_bytes_to_use is larger than the shared-memory file system
    (a container's small /dev/shm): start-up stops with an error that names the
    setting, its value and the room there is, and leaves no file behind."""

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    caches, spec = _one_group_caches()
    with pytest.raises(ValueError) as caught:
        create_data_plane(
            caches,
            [spec],
            3 << 20,
            pool_name=name,
            shm_dir=str(tmp_path),
        )
    message = str(caught.value)
    assert message.startswith("cpu_bytes_to_use: 3145728 bytes (3.0 MiB)")
    assert f"does not fit in {tmp_path}, which has " in message
    assert " free: its " in message and " chunk slots need " in message
    assert "No space left on device" in message
    assert list(tmp_path.iterdir()) == []


def test_a_budget_the_shm_dir_cannot_hold_names_what_all_ranks_need(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a two-rank engine's cpu_bytes_to_use is larger than /dev/shm:
    the error names the budget and the bytes both ranks' pools need together."""

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    caches, spec = _one_group_caches()
    slot = describe_kv_caches(caches, [spec]).geometry.slot_nbytes
    with pytest.raises(ValueError) as caught:
        create_data_plane(
            caches, [spec], 7 * slot, ranks=2, pool_name=name, shm_dir=str(tmp_path)
        )
    message = str(caught.value)
    assert message.startswith(f"cpu_bytes_to_use: {7 * slot} bytes")
    assert f" free: its 3 chunk slots on each of 2 ranks need {6 * slot} " in message


def test_a_budget_too_large_to_map_names_the_setting() -> None:
    """8 EiB and more cannot even be asked of the kernel (OverflowError)."""
    caches, spec = _one_group_caches()
    with pytest.raises(ValueError, match=r"cpu_bytes_to_use: 1180591620717411303424"):
        create_data_plane(caches, [spec], 1 << 70)


_CREATOR = """
import os, sys
from kvoffload.worker import HostPool, GroupGeometry, PoolGeometry
g = PoolGeometry.of([GroupGeometry(0, 2, 1024, 2), GroupGeometry(1, 1, 512, 4)])
if sys.argv[2] == "stall":  # killed while it reserves the pool's memory
    reserve = os.posix_fallocate
    def stalled(fd, offset, length):
        reserve(fd, offset, length)
        print("reserved", flush=True)
        sys.stdin.read()
    os.posix_fallocate = stalled
if sys.argv[2] == "elsewhere":  # a process of another host sharing the directory
    import kvoffload.processes
    kvoffload.processes.HOST_NAMESPACE = "otherhost-1"
pools = [HostPool.create(g, 3, name=n, shm_dir=sys.argv[1]) for n in sys.argv[3:]]
print("created", flush=True)
sys.stdin.read()
"""


@contextmanager
def _creator(shm_dir: Path, how: str, *names: str) -> Iterator[subprocess.Popen[str]]:
    """A process that creates pools `names` in `shm_dir` (`how`: "plain", "stall"
    in its reservation of the first, or "elsewhere" as of another host) and
    waits; killed at the end if it is still alive."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CREATOR, str(shm_dir), how, *names],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline()
        yield child
    finally:
        child.kill()
        child.wait()


def _kill(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL


def test_create_removes_the_pools_a_killed_creator_left(tmp_path: Path) -> None:
    """Scenario: a worker is SIGKILLed (the OOM killer, docker kill) with two
    named pools; a later start creates a pool in the same directory, one of the
    same name (a fixed engine_id): the dead worker's pools are removed, so its
    memory comes back and the name is free again."""
    with _creator(tmp_path, "plain", "pool-a", "pool-b") as child:
        _kill(child)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pool-a", "pool-b"]
    with HostPool.create(GEOMETRY, 1, name="pool-a", shm_dir=str(tmp_path)):
        assert [p.name for p in tmp_path.iterdir()] == ["pool-a"]
        assert HostPool.attach("pool-a", shm_dir=str(tmp_path)).num_slots == 1


def test_create_keeps_the_pools_of_live_creators_and_of_other_hosts(
    tmp_path: Path,
) -> None:
    """Scenario: another engine is running (its worker alive), this process
    has a pool of its own, and a killed process of another host left one in a
    directory the hosts share (whether it lives cannot be told from here): a
    new pool removes none of them, and the live engine's still attaches."""
    with _creator(tmp_path, "elsewhere", "other-host") as elsewhere:
        _kill(elsewhere)
    shm_dir = str(tmp_path)
    with (
        _creator(tmp_path, "plain", "live-engine"),
        HostPool.create(GEOMETRY, 2, name="own", shm_dir=shm_dir),
        HostPool.create(GEOMETRY, 1, name="new", shm_dir=shm_dir),
    ):
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == ["live-engine", "new", "other-host", "own"]
        assert HostPool.attach("live-engine", GEOMETRY, 3, shm_dir=shm_dir)


def test_create_removes_a_killed_creators_temporary_at_full_size(
    tmp_path: Path,
) -> None:
    """Scenario: a worker is killed while it reserves its pool's memory, so the
    hidden temporary file holds all of it; while the worker lived, another
    start left it alone (a creation in progress), and after the kill the next
    start removes it."""

    def hidden() -> list[int]:
        return [p.stat().st_size for p in tmp_path.iterdir() if p.name[0] == "."]

    full = 4096 + 3 * GEOMETRY.slot_nbytes
    with _creator(tmp_path, "stall", "stalled") as child:
        assert hidden() == [full]
        with HostPool.create(GEOMETRY, 1, name="first", shm_dir=str(tmp_path)):
            assert hidden() == [full]
        _kill(child)
    with HostPool.create(GEOMETRY, 1, name="second", shm_dir=str(tmp_path)):
        assert hidden() == []
        assert [p.name for p in tmp_path.iterdir()] == ["second"]


def test_a_pool_that_names_this_process_but_that_it_does_not_own_is_removed(
    tmp_path: Path,
) -> None:
    """Scenario: a pool file whose header names this very process (host, pid
    namespace, pid) is not one this process created and still has open: an
    earlier process that had this pid left it. A create of its name takes its
    place (it raised FileExistsError), and a create of any other name removes
    it, as it removes those of exited processes."""
    with HostPool.create(GEOMETRY, 2, name="a", shm_dir=str(tmp_path)) as pool:
        assert pool.path is not None
        left = pool.path.read_bytes()
    for name in ("b", "c"):
        (tmp_path / name).write_bytes(left)
    with HostPool.create(GEOMETRY, 3, name="b", shm_dir=str(tmp_path)) as pool:
        assert pool.num_slots == 3
        assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert list(tmp_path.iterdir()) == []


def test_a_pool_this_process_has_open_is_neither_removed_nor_replaced(
    tmp_path: Path,
) -> None:
    """A pool of this process still open stays when another is created beside
    it; a create of its own name is refused; and once one created with
    `exist_ok` replaced it, closing the first leaves the replacement."""
    with HostPool.create(GEOMETRY, 2, name="a", shm_dir=str(tmp_path)) as first:
        with HostPool.create(GEOMETRY, 2, name="b", shm_dir=str(tmp_path)):
            assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
        with pytest.raises(FileExistsError):
            HostPool.create(GEOMETRY, 1, name="a", shm_dir=str(tmp_path))
        replaced = HostPool.create(
            GEOMETRY, 3, name="a", shm_dir=str(tmp_path), exist_ok=True
        )
        first.close()
        with HostPool.attach("a", shm_dir=str(tmp_path)) as attached:
            assert attached.num_slots == 3
        replaced.close()
    assert list(tmp_path.iterdir()) == []
