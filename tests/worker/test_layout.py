"""Registration of KV tensors: what each layout becomes, and what is refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvoffload.worker.geometry import GroupGeometry, PoolGeometry
from kvoffload.worker.layout import GroupSpec, describe_kv_caches

from .kv_layouts import GROUPS, HEAD_DIM, HEADS, LAYOUTS, Layout, make_caches

CPU = torch.device("cpu")


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_worker_geometry_matches_the_scheduler_side_description(layout: Layout) -> None:
    """The scheduler, without tensors, computes the geometry the worker finds."""
    caches = make_caches(layout, torch.bfloat16, CPU)
    specs = [GroupSpec(g.group, g.layers, g.num_blocks, 4) for g in GROUPS]
    from_tensors = describe_kv_caches(caches, specs).geometry
    # K and V of `tokens` tokens, HEADS heads of HEAD_DIM, 2 bytes each.
    from_description = PoolGeometry.of(
        GroupGeometry(g.group, len(g.layers), 2 * g.tokens * HEADS * HEAD_DIM * 2, 4)
        for g in GROUPS
    )
    assert from_tensors == from_description
    assert from_tensors.slot_nbytes == max(
        len(g.layers) * 2 * g.tokens * HEADS * HEAD_DIM * 2 * 4 for g in GROUPS
    )


def test_fingerprint_follows_chunk_format_not_block_count() -> None:
    layout = LAYOUTS[2]
    a = describe_kv_caches(make_caches(layout, torch.float16, CPU), [_spec(0, 12, 2)])
    more = make_caches(layout, torch.float16, CPU)
    more["attn.0"] = layout.make(20, 4, torch.float16, CPU)
    more["attn.1"] = layout.make(20, 4, torch.float16, CPU)
    more["attn.2"] = layout.make(20, 4, torch.float16, CPU)
    b = describe_kv_caches(more, [_spec(0, 20, 2)])
    c = describe_kv_caches(make_caches(layout, torch.float16, CPU), [_spec(0, 12, 4)])
    d = describe_kv_caches(make_caches(layout, torch.bfloat16, CPU), [_spec(0, 12, 2)])
    assert a.fingerprint == b.fingerprint
    assert len({a.fingerprint, c.fingerprint, d.fingerprint}) == 3


def test_fingerprint_tells_apart_how_the_bytes_are_arranged() -> None:
    """vLLM's backends' layouts (FlashAttention K/V-major, FlashInfer/Triton
    block-major, each NHD or HND; the CPU backend) hold the same values in a
    different order in a chunk, so no two share a fingerprint; a fresh engine
    with the same layout has the same one, whatever its block count."""
    nb, bs, h, d = 12, 4, HEADS, HEAD_DIM

    def hnd(physical: tuple[int, ...], swap: tuple[int, int]) -> torch.Tensor:
        order = list(range(len(physical)))
        order[swap[0]], order[swap[1]] = order[swap[1]], order[swap[0]]
        return torch.zeros(physical, dtype=torch.float16).permute(order)

    def layouts(nb: int) -> dict[str, torch.Tensor]:
        return {
            "flash_attn": torch.zeros(2, nb, bs, h, d, dtype=torch.float16),
            "flash_attn/HND": hnd((2, nb, h, bs, d), (2, 3)),
            "flashinfer": torch.zeros(nb, 2, bs, h, d, dtype=torch.float16),
            "flashinfer/HND": hnd((nb, 2, h, bs, d), (2, 3)),
            "cpu": torch.zeros(nb, h, bs, 2 * d, dtype=torch.float16),
        }

    def fingerprint(tensor: torch.Tensor, nb: int) -> str:
        caches = dict.fromkeys(GROUPS[0].layers, tensor)
        return describe_kv_caches(caches, [_spec(0, nb, 2)]).fingerprint

    found = {name: fingerprint(t, nb) for name, t in layouts(nb).items()}
    assert len(set(found.values())) == len(found), found
    again = {name: fingerprint(t, 2 * nb) for name, t in layouts(2 * nb).items()}
    assert again == found


def test_padding_between_blocks_does_not_change_the_fingerprint() -> None:
    """Padding is not copied: a padded layout's chunks equal the dense one's."""
    caches = {
        layout.name: make_caches(layout, torch.float16, CPU) for layout in LAYOUTS
    }
    padded, dense = caches["padded pages"], caches["[blocks,2,tokens,heads*dim]"]
    specs = [_spec(0, 12, 2)]
    assert (
        describe_kv_caches(padded, specs).fingerprint
        == describe_kv_caches(dense, specs).fingerprint
    )


def test_explicit_block_dim_registers_a_cross_layer_tensor() -> None:
    """One tensor [layers, 2, blocks, ...] for all layers, given block_dim=2."""
    kv = {"all": torch.zeros(3, 2, 7, 4, 16)}
    layout = describe_kv_caches(kv, [GroupSpec(0, ("all",), 7, 1, block_dim=2)])
    assert len(layout.groups[0].regions) == 6
    assert layout.geometry.slot_nbytes == 3 * 2 * 4 * 16 * 4


def _spec(group: int, num_blocks: int, bpc: int = 1) -> GroupSpec:
    return GroupSpec(group, GROUPS[0].layers, num_blocks, bpc)


def _one(tensor: torch.Tensor, num_blocks: int = 6) -> None:
    describe_kv_caches(
        {"model.layers.3.attn": tensor},
        [GroupSpec(0, ("model.layers.3.attn",), num_blocks, 1)],
    )


@pytest.mark.parametrize(
    ("tensor", "reason"),
    [
        (torch.zeros(6), "at least 2 dimensions"),
        (torch.zeros(5, 6, 4)[:, :5], "size num_blocks"),
        (torch.zeros(3, 4, 16), "size num_blocks=6"),
        (torch.zeros(6, 4, 16)[:, :, ::2], "not contiguous"),
        (torch.zeros(1, 64).expand(6, 64), "stride 0"),
        (
            torch.zeros(6, 2, 8)[:, :, :4],
            "not contiguous",
        ),
    ],
    ids=["1-d", "no-block-dim", "wrong-count", "strided-inner", "expanded", "sliced"],
)
def test_unsupported_layout_names_the_tensor_and_its_shape(
    tensor: torch.Tensor, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason) as info:
        _one(tensor)
    assert "model.layers.3.attn" in str(info.value)
    assert str(list(tensor.shape)) in str(info.value)


def test_block_dim_overlapping_another_dimension_is_refused() -> None:
    base = torch.zeros(64)
    overlapping = base.as_strided((6, 8), (4, 1))  # blocks overlap by half
    with pytest.raises(ValueError, match="overlap"):
        _one(overlapping)


def test_two_blocks_with_a_leading_pair_is_ambiguous() -> None:
    with pytest.raises(ValueError, match="ambiguous"):
        _one(torch.zeros(2, 2, 4, 8), num_blocks=2)


@pytest.mark.parametrize(
    ("caches", "specs", "reason"),
    [
        ({"a": torch.zeros(6, 8)}, [GroupSpec(0, ("a", "b"), 6, 1)], "no KV tensor"),
        (
            {"a": torch.zeros(6, 8), "b": torch.zeros(6, 16)},
            [GroupSpec(0, ("a", "b"), 6, 1)],
            "differ in bytes per engine block",
        ),
        (
            {"a": torch.zeros(6, 8)},
            [GroupSpec(0, ("a",), 6, 1), GroupSpec(1, ("a",), 6, 1)],
            "in groups 0 and 1",
        ),
        ({"a": "not a tensor"}, [GroupSpec(0, ("a",), 6, 1)], "not a tensor"),
    ],
    ids=["missing-layer", "mixed-sizes", "layer-in-two-groups", "not-a-tensor"],
)
def test_inconsistent_registration_is_refused(
    caches: dict[str, torch.Tensor], specs: list[GroupSpec], reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        describe_kv_caches(caches, specs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"layer_names": ()}, "layer_names"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"blocks_per_chunk": 0}, "blocks_per_chunk"),
        ({"group": -1}, "group"),
    ],
)
def test_group_spec_validates_its_fields(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, Any] = {
        "group": 0,
        "layer_names": ("a",),
        "num_blocks": 4,
        "blocks_per_chunk": 1,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        GroupSpec(**args)


def test_single_engine_block_cache_registers_by_position() -> None:
    """With one engine block its stride means nothing; the block is the rest."""
    kv = {"a": torch.zeros(2, 1, 4, 16)}
    layout = describe_kv_caches(kv, [GroupSpec(0, ("a",), 1, 1, block_dim=1)])
    assert [r.offset for r in layout.groups[0].regions] == [0, 4 * 16 * 4]
    assert layout.geometry.slot_nbytes == 2 * 4 * 16 * 4
