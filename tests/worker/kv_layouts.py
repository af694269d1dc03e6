"""Engine KV caches in every layout the data plane supports, for the tests.

Each layout builds one layer's tensor(s) filled with random bytes, and reads one
engine block back as bytes, independently of the code under test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

HEADS, HEAD_DIM = 2, 8

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Layout:
    """How one engine lays out one layer, and how to read one block of it."""

    name: str
    make: Callable[[int, int, torch.dtype, torch.device], Tensors]
    block: Callable[[Tensors, int], list[torch.Tensor]]


def random_tensor(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Random bytes viewed as `dtype`: every bit pattern, NaNs included."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = itemsize
    for size in shape:
        count *= size
    raw = torch.randint(0, 256, (count,), dtype=torch.uint8, device=device)
    return raw.view(dtype).view(shape)


def as_bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def _cpu_vllm(nb: int, tokens: int, dtype: torch.dtype, dev: torch.device) -> Tensors:
    return (random_tensor((nb, HEADS, tokens, 2 * HEAD_DIM), dtype, dev),)


def _block_kv(nb: int, tokens: int, dtype: torch.dtype, dev: torch.device) -> Tensors:
    return (random_tensor((nb, 2, tokens, HEADS * HEAD_DIM), dtype, dev),)


def _kv_block(nb: int, tokens: int, dtype: torch.dtype, dev: torch.device) -> Tensors:
    return (random_tensor((2, nb, tokens, HEADS, HEAD_DIM), dtype, dev),)


def _kv_block_hnd(
    nb: int, tokens: int, dtype: torch.dtype, dev: torch.device
) -> Tensors:
    # Logical [2, blocks, tokens, heads, dim]; heads before tokens in memory.
    physical = random_tensor((2, nb, HEADS, tokens, HEAD_DIM), dtype, dev)
    return (physical.permute(0, 1, 3, 2, 4),)


def _kv_apart(nb: int, tokens: int, dtype: torch.dtype, dev: torch.device) -> Tensors:
    shape = (nb, tokens, HEADS, HEAD_DIM)
    return (random_tensor(shape, dtype, dev), random_tensor(shape, dtype, dev))


def _padded(nb: int, tokens: int, dtype: torch.dtype, dev: torch.device) -> Tensors:
    # Engine blocks padded to a larger page, as hybrid models pad their pages.
    row = 2 * tokens * HEADS * HEAD_DIM
    page = random_tensor((nb, row + 3 * HEAD_DIM), dtype, dev)
    return (page[:, :row].view(nb, 2, tokens, HEADS * HEAD_DIM),)


def _first(tensors: Tensors, block: int) -> list[torch.Tensor]:
    return [t[block] for t in tensors]


def _second(tensors: Tensors, block: int) -> list[torch.Tensor]:
    return [t[:, block] for t in tensors]


LAYOUTS = (
    Layout("cpu_vllm[blocks,heads,tokens,2*dim]", _cpu_vllm, _first),
    Layout("[blocks,2,tokens,heads*dim]", _block_kv, _first),
    Layout("[2,blocks,tokens,heads,dim]", _kv_block, _second),
    Layout("[2,blocks,tokens,heads,dim]/HND", _kv_block_hnd, _second),
    Layout("K,V apart [blocks,tokens,heads,dim]", _kv_apart, _first),
    Layout("padded pages", _padded, _first),
)


@dataclass(frozen=True)
class GroupShape:
    """One group of the test cache: its layers, tokens per block, block count."""

    group: int
    layers: tuple[str, ...]
    tokens: int
    num_blocks: int


# Two groups with different block sizes, block counts and layer sets.
GROUPS = (
    GroupShape(0, ("attn.0", "attn.1", "attn.2"), tokens=4, num_blocks=12),
    GroupShape(1, ("swa.0", "swa.1"), tokens=8, num_blocks=10),
)


def make_caches(
    layout: Layout,
    dtype: torch.dtype,
    device: torch.device,
    groups: tuple[GroupShape, ...] = GROUPS,
) -> dict[str, Tensors]:
    return {
        name: layout.make(g.num_blocks, g.tokens, dtype, device)
        for g in groups
        for name in g.layers
    }


def block_bytes(
    layout: Layout, caches: dict[str, Tensors], group: GroupShape, block: int
) -> torch.Tensor:
    """Engine block `block` of every layer of `group`, as bytes."""
    return as_bytes(
        [t for name in group.layers for t in layout.block(caches[name], block)]
    )


def scramble(caches: dict[str, Tensors]) -> None:
    """Overwrite every engine block with new random bytes."""
    for tensors in caches.values():
        for t in tensors:
            t.copy_(random_tensor(tuple(t.shape), t.dtype, t.device))
