"""Two real vLLM engines (CPU platform), in two processes running at the same
time, sharing one Redis server and one file-tier directory.

The engines (`share_engine.py`) start once for the module; the tests run in
order, each on what the previous ones left. Engine A computes prompts, engine B
serves them from the shared tiers (`kv_load_tiers` names the tier a check is
about), A is killed with SIGKILL in the middle of a chunk write and restarted,
and then both write into the directory at once, measured under its ledger's
lock (`file_ledger`). Greedy outputs are compared with a third engine's, without
kvoffload, run in the test's process while A and B start.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import pytest

from kvoffload import OffloadKey
from kvoffload.integrations.vllm.model_builder import BuiltModel, synthetic_text
from kvoffload.tiers.secondary.file_io import ChunkFiles
from kvoffload.tiers.secondary.file_ledger import SpaceLedger
from kvoffload.tiers.secondary.file_scan import count_directory
from kvoffload.tiers.secondary.redis_server import RedisServer, find_redis_server

from . import share_engine

pytestmark = [pytest.mark.vllm, pytest.mark.redis]

SCRIPT = Path(__file__).with_name("share_engine.py")
BLOCK = 128
PAGE = 4 * 131072  # one chunk (one block of all four layers), float32
CHUNK_FILE = PAGE + 4096  # its file: the header page, then the payload
CAPACITY = 12 * CHUNK_FILE
KILL_AFTER = 3  # chunk files A completes before it is killed mid-write
START_S = 600.0
CALL_S = 300.0

P_REDIS = synthetic_text(250, seed=101)  # about 347 tokens: 2 whole chunks
P_FILE = synthetic_text(250, seed=102)
P_KILL = synthetic_text(600, seed=103)  # 6 whole chunks
P_KILL_REDIS = synthetic_text(250, seed=104)
A_BATCH = [synthetic_text(250, seed=200 + i) for i in range(10)]
B_BATCH = [synthetic_text(250, seed=300 + i) for i in range(10)]
CHECKED = [P_REDIS, P_FILE, P_KILL, P_KILL_REDIS]


class Engine:
    """A `share_engine.py` process: commands in, replies and events out."""

    def __init__(self, name: str, config: dict[str, Any], logs: Path) -> None:
        self.name = name
        self._config = config
        self._logs = logs
        self._start()

    def _start(self) -> None:
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        log = open(self._logs / f"{self.name}.log", "a")  # noqa: SIM115
        with log:
            self.proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), json.dumps(self._config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        assert self.proc.stdout is not None
        self.replies: queue.Queue[str] = queue.Queue()
        self.events: queue.Queue[str] = queue.Queue()
        reader = partial(self._read, self.proc.stdout, self.replies, self.events)
        threading.Thread(target=reader, daemon=True).start()

    @staticmethod
    def _read(
        stdout: IO[str], replies: queue.Queue[str], events: queue.Queue[str]
    ) -> None:
        for line in stdout:
            if line.startswith("EVENT "):
                events.put(line.removeprefix("EVENT ").strip())
            elif line.startswith(("READY", "REPLY ", "ERROR ")):
                replies.put(line.strip())
        replies.put("EXITED")

    def _next(self, timeout_s: float) -> str:
        try:
            line: str = self.replies.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(
                f"engine {self.name}: no reply in {timeout_s} s"
            ) from None
        return line

    def ready(self) -> None:
        line = self._next(START_S)
        assert line == "READY", (
            f"engine {self.name} did not start: {line}\n{self.log()}"
        )

    def send(self, op: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout_s: float = CALL_S) -> Any:
        line = self._next(timeout_s)
        assert line.startswith("REPLY "), f"engine {self.name}: {line}\n{self.log()}"
        return json.loads(line.removeprefix("REPLY "))

    def call(self, op: str, **args: Any) -> Any:
        self.send(op, **args)
        return self.reply()

    def generate(self, prompts: list[str], **params: Any) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call(
            "generate", prompts=prompts, params=params or None
        )
        return result

    def log(self) -> str:
        return (self._logs / f"{self.name}.log").read_text()[-4000:]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def restart(self) -> None:
        self._start()
        self.ready()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("exit")
                self.proc.wait(60)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(30)


@dataclass
class Fleet:
    a: Engine
    b: Engine
    directory: Path
    """The file tier's fingerprint directory, once A has made it."""
    reference: dict[str, list[int]]

    def chunk_directory(self) -> Path:
        (found,) = [p for p in self.directory.iterdir() if not p.name.startswith(".")]
        return found


def measure(directory: Path) -> tuple[int, int]:
    """Under the ledger's lock (no engine changes an entry meanwhile): the
    bytes of the chunk and temporary files in `directory`, and the ledger's
    total."""
    path = str(directory)
    ledger = SpaceLedger(path, 0, 0o600, 0o700, partial(count_directory, path))
    try:
        with ledger.hold() as book:
            return sum(count_directory(path)), book.total
    finally:
        ledger.close()


def plain_outputs(model: BuiltModel) -> dict[str, list[int]]:
    """Each checked prompt's greedy output from an engine without kvoffload,
    set up as `share_engine.py` sets up its engines. It runs in this process:
    an engine of its own process would import vLLM once more."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        **model.vllm_args(),
        enforce_eager=True,
        max_model_len=2048,
        seed=0,
        disable_log_stats=False,
        **share_engine.DEVICE,
    )
    try:
        sampling = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        outputs = llm.generate(CHECKED, sampling, use_tqdm=False)
    finally:
        llm.llm_engine.engine_core.shutdown()
    return {
        p: list(o.outputs[0].token_ids) for p, o in zip(CHECKED, outputs, strict=True)
    }


@pytest.fixture(scope="module")
def fleet(
    tiny_model: BuiltModel,
    vllm_in_process: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    if find_redis_server() is None:
        pytest.skip("redis-server not found (`make test` installs it)")
    root = tmp_path_factory.mktemp("sharing")
    model = tiny_model.vllm_args()
    with RedisServer(str(root)) as redis:
        kv = {
            "cpu_bytes_to_use": "32MiB",
            "secondary_tiers": [
                {
                    "type": "file",
                    "path": str(root / "kv"),
                    "capacity": CAPACITY,
                    "rescan_interval_s": 1,
                    "num_threads": 1,  # chunk writes in prefix order
                },
                {"type": "redis", "url": redis.url},
            ],
        }
        engines = [Engine(n, {"model": model, "kv": kv}, root) for n in "ab"]
        try:
            reference = plain_outputs(tiny_model)  # while A and B start
            for engine in engines:
                engine.ready()
            yield Fleet(engines[0], engines[1], root / "kv", reference)
        finally:
            for engine in engines:
                engine.close()


def chunk_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.kvc"))


def test_b_serves_from_redis_a_prefix_a_computed(fleet: Fleet) -> None:
    (first,) = fleet.a.generate([P_REDIS], kv_store_tiers=["redis"])
    assert first["cached"] == 0
    fleet.a.call("step_until", metric="chunks_stored|redis", at_least=2)
    (served,) = fleet.b.generate([P_REDIS], kv_load_tiers=["redis"])
    assert served["cached"] == 2 * BLOCK
    assert served["tokens"] == first["tokens"] == fleet.reference[P_REDIS]


def test_b_serves_from_the_shared_directory_a_prefix_a_computed(fleet: Fleet) -> None:
    (first,) = fleet.a.generate([P_FILE], kv_store_tiers=["file"])
    fleet.a.call("step_until", metric="chunks_stored|file", at_least=2)
    on_disk = len(chunk_files(fleet.directory))
    # B's rescans (every second) find every chunk file there, A's among them.
    fleet.b.call("step_until", metric="occupancy|file", at_least=on_disk)
    (served,) = fleet.b.generate([P_FILE], kv_load_tiers=["file"])
    assert served["cached"] == 2 * BLOCK
    assert served["tokens"] == first["tokens"] == fleet.reference[P_FILE]


def intact(directory: Path) -> bool:
    """Every chunk file passes its checks (header, length, checksum)."""
    fingerprint = directory.name
    files = ChunkFiles(str(directory.parent), fingerprint, direct=False)
    for path in chunk_files(directory):
        key = OffloadKey(bytes.fromhex(path.name.removesuffix(".kvc")))
        files.read(key, [memoryview(bytearray(PAGE))])
    return True


def test_a_killed_mid_store_leaves_b_nothing_wrong_and_a_restarted_finds_its_chunks(
    fleet: Fleet,
) -> None:
    """A stores P_KILL's six chunks to both tiers and P_KILL_REDIS's to Redis;
    its file tier (one I/O thread, in prefix order) completes three chunk files
    and blocks halfway through the fourth, and A is SIGKILLed there. B loads
    exactly those three from the directory, whatever A left in Redis, and
    answers as the engine without kvoffload; every chunk file checks out. A,
    restarted, removes its dead write and finds its three chunk files."""
    fleet.a.send("block_file_writes_after", n=KILL_AFTER)
    assert fleet.a.reply() is None
    fleet.a.generate([P_KILL])
    fleet.a.generate([P_KILL_REDIS], kv_store_tiers=["redis"])
    assert fleet.a.events.get(timeout=CALL_S) == "blocked"
    fleet.a.kill()

    directory = fleet.chunk_directory()
    left = list(directory.rglob("*.tmp"))
    assert len(left) == 1 and left[0].stat().st_size == CHUNK_FILE, "killed mid-write"
    on_disk, counted = measure(directory)
    assert on_disk == counted <= CAPACITY
    assert intact(directory)

    fleet.b.call(
        "step_until", metric="occupancy|file", at_least=len(chunk_files(directory))
    )
    # B stores what it computes to Redis only: the directory keeps what A left.
    (from_file,) = fleet.b.generate(
        [P_KILL], kv_load_tiers=["file"], kv_store_tiers=["redis"]
    )
    assert from_file["cached"] == KILL_AFTER * BLOCK
    assert from_file["tokens"] == fleet.reference[P_KILL]
    (from_redis,) = fleet.b.generate([P_KILL_REDIS], kv_load_tiers=["redis"])
    assert from_redis["tokens"] == fleet.reference[P_KILL_REDIS]
    assert from_redis["cached"] % BLOCK == 0

    fleet.a.restart()
    assert not list(directory.rglob("*.tmp")), "the dead writer's file is removed"
    on_disk, counted = measure(directory)
    assert on_disk == counted <= CAPACITY
    (again,) = fleet.a.generate([P_KILL], kv_load_tiers=["file"])
    assert again["cached"] == KILL_AFTER * BLOCK
    assert again["tokens"] == fleet.reference[P_KILL]
    assert intact(directory)
    print(
        f"\nkill: B cached {from_file['cached']} from file, "
        f"{from_redis['cached']} from Redis; restarted A cached {again['cached']}"
    )


def test_the_directory_stays_within_its_capacity_while_both_engines_write(
    fleet: Fleet,
) -> None:
    """Both engines store twenty chunks each at once into a directory with room
    for twelve chunk files: measured under the ledger's lock all along, the
    directory never holds more than the capacity, and holds exactly what the
    ledger counts."""
    directory = fleet.chunk_directory()
    stop = threading.Event()
    samples: list[tuple[int, int]] = []

    def sample() -> None:
        while not stop.wait(0.02):
            samples.append(measure(directory))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        fleet.a.send("generate", prompts=A_BATCH, params=None)
        fleet.b.send("generate", prompts=B_BATCH, params=None)
        fleet.a.reply()
        fleet.b.reply()
        for engine in (fleet.a, fleet.b):  # steps that take in the last stores
            for _ in range(3):
                engine.generate(["hello"])
    finally:
        stop.set()
        sampler.join()
    samples.append(measure(directory))
    stats = [engine.call("metrics") for engine in (fleet.a, fleet.b)]
    stored = [s.get("chunks_stored|file", 0.0) for s in stats]
    evicted = [s.get("evictions|file", 0.0) for s in stats]
    skipped = [s.get("store_skipped|file", 0.0) for s in stats]
    largest = max(on_disk for on_disk, _ in samples)
    print(
        f"\ndirectory: {len(samples)} samples, at most {largest:,} of "
        f"{CAPACITY:,} bytes; file chunks stored {stored}, evicted {evicted}, "
        f"skipped {skipped} (A, B)"
    )
    assert all(on_disk == counted for on_disk, counted in samples)
    assert largest <= CAPACITY
    assert sum(stored) * CHUNK_FILE > 2 * CAPACITY, "both wrote past the capacity"
    assert sum(evicted) > 0
