"""Retention hints through vLLM's OpenAI-compatible server (issue 25).

docs/vllm.md tells users to send `kv_retention_s` with the `openai` client's
`extra_body={"kv_transfer_params": {...}}`. This runs that path for real: vLLM
0.32's `api_server` in its own processes, as `vllm serve` starts it, with the
connector on the tiny model and the scenario of `test_retention_hints.py`
(device cache of 16 usable blocks, host tier of 10 chunks): H comes with a hint
of 600 s, U with none, 8 unhinted prompts flood both tiers, and H comes back
with its two chunks loaded from host memory where U, stored after it, comes
back with nothing. Cached tokens are the server's own report
(`usage.prompt_tokens_details`), outputs are compared, and the connector's
metrics are read from `/metrics`. A flood prompt sent to `/v1/chat/completions`
with a bad hint (`"soon"`) is served, and the engine logs the one warning SPEC
§4 gives a bad per-request parameter. When the server is stopped (SIGTERM,
as a container stop sends), host memory's shared-memory pool is gone from
/dev/shm. About a minute: the server's start.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kvoffload.integrations.vllm.model_builder import BuiltModel

from .conftest import VLLM_MISSING
from .test_connector_e2e import BLOCK, DEVICE, PAGE, kv_config
from .test_retention_hints import FLOOD, HINTED, HOST_CHUNKS, UNHINTED

pytestmark = pytest.mark.vllm

START_TIMEOUT_S = 300.0
ENGINE_ID = f"openai-server-test-{os.getpid()}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _up(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


class Server:
    """A running `api_server`: its base URL, log and served model name."""

    def __init__(self, base: str, log: Path, model: str) -> None:
        self.base = base
        self.log = log
        self.model = model

    def metric(self, name: str) -> float:
        """`vllm:kvoffload_<name>` of host memory, from `/metrics`."""
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        pattern = re.compile(
            rf'^vllm:kvoffload_{name}\{{[^}}]*tier="cpu"[^}}]*\}} (\S+)$', re.M
        )
        values = [float(v) for v in pattern.findall(text)]
        assert values, f"no vllm:kvoffload_{name} for tier cpu in /metrics"
        return sum(values)


@contextmanager
def _serve(model: BuiltModel, log: Path) -> Iterator[Server]:
    """vLLM's `api_server` with the connector, until SIGTERM at the end."""
    port = _free_port()
    args = model.vllm_args()
    kv = kv_config(engine_id=ENGINE_ID, cpu_bytes_to_use=HOST_CHUNKS * PAGE)
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", args["model"], "--tokenizer", args["tokenizer"],
        "--dtype", args["dtype"], "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--enforce-eager", "--seed", "0",
        "--kv-cache-memory-bytes", str(DEVICE["kv_cache_memory_bytes"]),
        "--max-num-batched-tokens", str(DEVICE["max_num_batched_tokens"]),
        "--enable-prompt-tokens-details",
        "--kv-transfer-config", json.dumps(kv),
    ]  # fmt: skip
    # As users start it: its engine in a process of its own.
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _up(base):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-4000:]
                pytest.fail(f"vLLM's api_server did not start:\n{tail}")
            time.sleep(1)
        yield Server(base, log, "tiny")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _complete(client: Any, server: Server, prompt: str, hint: object = None) -> Any:
    extra = {} if hint is None else {"kv_transfer_params": {"kv_retention_s": hint}}
    return client.completions.create(
        model=server.model, prompt=prompt, max_tokens=8, temperature=0, extra_body=extra
    )


def _cached(reply: Any) -> int:
    details = reply.usage.prompt_tokens_details
    return 0 if details is None else int(details.cached_tokens or 0)


def test_a_hint_sent_through_the_openai_server_keeps_a_prefix(
    tiny_model: BuiltModel, tmp_path: Path
) -> None:
    pytest.importorskip("vllm", reason=VLLM_MISSING)
    openai = pytest.importorskip("openai", reason="the openai client comes with vLLM")
    with _serve(tiny_model, tmp_path / "server.log") as server:
        client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="EMPTY")
        _hinted_prefix_outlives_a_flood(client, server)
        assert _pools(), "host memory's pool is a file in /dev/shm while it runs"
    assert _pools() == [], "the stopped server left its host pool in /dev/shm"


def _pools() -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"kvoffload-{ENGINE_ID}-*"))


def _hinted_prefix_outlives_a_flood(client: Any, server: Server) -> None:
    hinted = _complete(client, server, HINTED, hint=600)
    unhinted = _complete(client, server, UNHINTED)
    assert server.metric("hinted_chunks") > 0
    for prompt in FLOOD[1:]:
        _complete(client, server, prompt)
    chat = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": FLOOD[0]}],
        max_tokens=8,
        temperature=0,
        extra_body={"kv_transfer_params": {"kv_retention_s": "soon"}},
    )
    assert chat.choices[0].message.content is not None

    hinted_again = _complete(client, server, HINTED)
    unhinted_again = _complete(client, server, UNHINTED)
    assert _cached(hinted) == _cached(unhinted) == 0
    assert _cached(hinted_again) == 2 * BLOCK
    assert _cached(unhinted_again) == 0, "the flood evicted U everywhere"
    assert hinted_again.choices[0].text == hinted.choices[0].text
    assert unhinted_again.choices[0].text == unhinted.choices[0].text
    assert server.metric("hints_honoured_total") == 2

    warned = [
        line
        for line in server.log.read_text(errors="replace").splitlines()
        if "ignoring kv_retention_s='soon'" in line
    ]
    assert len(warned) == 1, warned
