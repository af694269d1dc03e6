"""A request whose tokens the engine rewrites (vLLM's streaming-input sessions:
the last sampled token is dropped and the next input joins the prompt): chunks
past the tokens kept are stored under their new keys, and nothing becomes
readable under a key of tokens the request no longer has."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.connector import (
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
)
from kvoffload.engine_model import SimRequest
from kvoffload.keys import BlockHasher
from kvoffload.worker.base import JobResult

from .conftest import RecordingManager

HASHER = BlockHasher(4)
CHUNK = 8
BLOCKS = (1, 2, 3, 4, 5, 6)


@dataclass
class Session:
    """A `RequestInfo` whose tokens a test rewrites."""

    request_id: str
    tokens: list[int]
    num_prompt_tokens: int
    kv_transfer_params: object = None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def block_hashes(self) -> Sequence[bytes]:
        return HASHER.hash_blocks(self.tokens)

    def take_next_input(self, kept: int, tokens: list[int]) -> None:
        self.tokens[kept:] = tokens
        self.num_prompt_tokens = len(self.tokens)


def found(connector: OffloadConnector, req_id: str, tokens: list[int]) -> int | None:
    """Tokens a new request with `tokens` (and one more to compute) can load."""
    req = SimRequest(req_id, 0.0, len(tokens) + 1, 1, HASHER.hash_blocks(tokens), 4)
    return connector.get_num_new_matched_tokens(req, 0)


def test_a_store_in_flight_past_the_rewrite_never_becomes_readable() -> None:
    """Scenario: S computed 24 tokens and their three chunks are being stored when
    S's tokens from 12 on are rewritten; the new input's forward pass may write
    those blocks before the copy ends. When the store completes, only chunk 0
    (tokens S kept) is readable; S's next step stores chunks 1 and 2 under the
    keys of its new tokens."""
    manager = RecordingManager(16)
    config = ConnectorConfig((GroupSpec(4, 2),), offload_prompt_only=False)
    connector = OffloadConnector(config, manager)
    old = list(range(100, 124))
    s = Session("S", list(old), 16)
    connector.on_new_request(s)
    assert connector.get_num_new_matched_tokens(s, 0) == 0
    connector.update_state_after_alloc("S", [BLOCKS], 0, 0)
    first = connector.build_step([ScheduledRequest("S", 0, 24)])
    assert len(first.stores) == 1

    s.take_next_input(12, list(range(500, 512)))
    connector.on_request_rewritten("S", 12)
    connector.on_job_results([JobResult(j.job_id, True) for j in first.stores])
    assert found(connector, "old", old) == CHUNK

    connector.update_state_after_alloc("S", [BLOCKS], 12, 0)
    step = ScheduledRequest("S", 12, 12, (BLOCKS,), replace_block_ids=True)
    second = connector.build_step([step])
    connector.on_job_results([JobResult(j.job_id, True) for j in second.stores])
    assert found(connector, "new", s.tokens) == 3 * CHUNK
    assert found(connector, "old again", old) == CHUNK
