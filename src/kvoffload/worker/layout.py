"""Registration of the engine's KV tensors: where each engine block's bytes are.

The engine lays its KV cache out as it likes: one tensor per layer or K and V
apart, block-major (`[num_blocks, ...]`) or K/V-major (`[2, num_blocks, ...]`),
any dtype, any permutation of the dimensions inside an engine block. Each tensor
is reduced to one or more `BlockRegion`s: a run of bytes per engine block at a
fixed stride. A layout that cannot be reduced so is a `ValueError` naming the
tensor and its shape.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from kvoffload.worker.geometry import GroupGeometry, PoolGeometry

KVCaches = Mapping[str, "torch.Tensor | Sequence[torch.Tensor]"]
"""Engine KV tensors by layer name: one tensor, or several (K and V kept apart)."""


@dataclass(frozen=True)
class GroupSpec:
    """What the engine says about one KV-cache group.

    `block_dim` is the tensor dimension indexed by engine block; `None` means the
    first of the first two dimensions whose size is `num_blocks`.
    """

    group: int
    layer_names: tuple[str, ...]
    num_blocks: int
    blocks_per_chunk: int
    block_dim: int | None = None

    def __post_init__(self) -> None:
        if not self.layer_names or len(set(self.layer_names)) != len(self.layer_names):
            raise ValueError(
                f"group {self.group}: layer_names {self.layer_names!r} must be "
                "non-empty and unique"
            )
        for field in ("group", "num_blocks", "blocks_per_chunk"):
            value = getattr(self, field)
            minimum = 0 if field == "group" else 1
            if type(value) is not int or value < minimum:
                raise ValueError(
                    f"group {self.group}: {field}={value!r} is not an integer "
                    f">= {minimum}"
                )


@dataclass(frozen=True)
class BlockRegion:
    """One run of `block_nbytes` bytes per engine block inside one KV tensor.

    Engine block `b`'s run starts `offset + b * block_stride` bytes after the
    tensor's first element. `part` indexes the layer's tensors (K and V apart).
    """

    layer: str
    part: int
    dtype: str
    offset: int
    block_stride: int
    block_nbytes: int


@dataclass(frozen=True)
class GroupLayout:
    """The regions of one group, in the order their bytes are laid out in a chunk.

    In a chunk, region `r` holds `blocks_per_chunk` consecutive runs starting at
    `chunk_offsets[r]`, so a partial chunk is a prefix of each region's part.
    `arrangements` describes each layer tensor's dimensions in memory order
    (`_arrangement`), in the order of `regions`: what the bytes of a run mean.
    """

    group: int
    num_blocks: int
    blocks_per_chunk: int
    num_layers: int
    regions: tuple[BlockRegion, ...]
    arrangements: tuple[str, ...] = ()

    @property
    def block_nbytes(self) -> int:
        return sum(r.block_nbytes for r in self.regions)

    @property
    def chunk_offsets(self) -> tuple[int, ...]:
        sizes = [r.block_nbytes * self.blocks_per_chunk for r in self.regions]
        return tuple(itertools.accumulate(sizes, initial=0))[:-1]

    @property
    def geometry(self) -> GroupGeometry:
        return GroupGeometry(
            group=self.group,
            num_layers=self.num_layers,
            layer_block_nbytes=self.block_nbytes // self.num_layers,
            blocks_per_chunk=self.blocks_per_chunk,
        )


@dataclass(frozen=True)
class KVLayout:
    """Every registered group's regions, and the device the tensors live on."""

    device: str
    groups: tuple[GroupLayout, ...]

    @property
    def geometry(self) -> PoolGeometry:
        return PoolGeometry.of(g.geometry for g in self.groups)

    def group(self, group: int) -> GroupLayout:
        for g in self.groups:
            if g.group == group:
                return g
        raise KeyError(f"group {group} is not registered")

    @property
    def fingerprint(self) -> str:
        """Hex digest of what a chunk's bytes mean; equal layouts share chunks.

        Deterministic for the same engine across restarts: no addresses, and no
        engine block count (which follows the memory given to the engine).
        """
        parts = [
            f"{g.group}:{g.blocks_per_chunk}:"
            + ",".join(f"{r.dtype}/{r.block_nbytes}" for r in g.regions)
            + ":"
            + ",".join(g.arrangements)
            for g in self.groups
        ]
        return hashlib.sha256(";".join(parts).encode()).hexdigest()[:32]


def describe_kv_caches(kv_caches: KVCaches, groups: Sequence[GroupSpec]) -> KVLayout:
    """The layout of the engine's KV tensors; `ValueError` if it cannot be handled.

    Layers not named by any group are ignored. Every layer of a group must have
    the same bytes per engine block, as the engine's groups do.
    """
    if not groups:
        raise ValueError("describe_kv_caches: no groups given")
    ids = [spec.group for spec in groups]
    if len(set(ids)) != len(ids):
        raise ValueError(f"describe_kv_caches: group ids {ids} are not unique")
    owner: dict[str, int] = {}
    for spec in groups:
        for layer in spec.layer_names:
            if layer in owner:
                raise ValueError(
                    f"layer {layer!r} is in groups {owner[layer]} and {spec.group}"
                )
            owner[layer] = spec.group
    devices = {
        t.device
        for layer in owner
        if layer in kv_caches
        for t in layer_tensors(kv_caches, layer)
    }
    if len(devices) > 1:
        raise ValueError(
            f"KV tensors are on several devices: {sorted(map(str, devices))}"
        )
    layouts = sorted(
        (_group_layout(kv_caches, spec) for spec in groups), key=lambda g: g.group
    )
    return KVLayout(str(devices.pop()), tuple(layouts))


def _group_layout(kv_caches: KVCaches, spec: GroupSpec) -> GroupLayout:
    regions: list[BlockRegion] = []
    arrangements: list[str] = []
    layer_nbytes: dict[str, int] = {}
    for layer in spec.layer_names:
        if layer not in kv_caches:
            raise ValueError(f"group {spec.group}: no KV tensor for layer {layer!r}")
        tensors = layer_tensors(kv_caches, layer)
        layer_regions = [
            region
            for part, tensor in enumerate(tensors)
            for region in _regions_of(layer, part, len(tensors), tensor, spec)
        ]
        layer_nbytes[layer] = sum(r.block_nbytes for r in layer_regions)
        # After `_regions_of`, which names a tensor it cannot handle.
        arrangements += (_arrangement(t, spec) for t in tensors)
        regions += layer_regions
    if len(set(layer_nbytes.values())) != 1:
        raise ValueError(
            f"group {spec.group}: layers differ in bytes per engine block "
            f"({layer_nbytes}); each group must be uniform"
        )
    return GroupLayout(
        spec.group,
        spec.num_blocks,
        spec.blocks_per_chunk,
        len(spec.layer_names),
        tuple(regions),
        tuple(arrangements),
    )


def _arrangement(tensor: torch.Tensor, spec: GroupSpec) -> str:
    """The tensor's dtype and its dimensions from outermost to innermost in
    memory, each as `index:size` (`index:B` for the engine block dimension).

    Regions alone do not tell K/V-major from block-major (`[2, nb, ...]` vs
    `[nb, 2, ...]`) or tokens before heads from heads before tokens (NHD vs HND),
    yet a chunk's bytes differ between them.
    """
    block_dim = _block_dim(tuple(tensor.shape), spec, "")
    dims = sorted(
        (
            (-stride, i, "B" if i == block_dim else str(size))
            for i, (size, stride) in enumerate(
                zip(tensor.shape, tensor.stride(), strict=True)
            )
            if size > 1 or i == block_dim
        ),
    )
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{dtype}[" + " ".join(f"{i}:{size}" for _, i, size in dims) + "]"


def layer_tensors(kv_caches: KVCaches, layer: str) -> tuple[torch.Tensor, ...]:
    """The tensors of `layer`: one, or several when K and V are kept apart."""
    value = kv_caches[layer]
    tensors = (value,) if isinstance(value, torch.Tensor) else tuple(value)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ValueError(
            f"KV cache of layer {layer!r} is not a tensor or a sequence of tensors"
        )
    return tensors


def engine_block_view(
    tensor: torch.Tensor, region: BlockRegion, num_blocks: int
) -> torch.Tensor:
    """A `uint8` view `[num_blocks, block_nbytes]` of `region` in `tensor`."""
    storage = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    storage.set_(tensor.untyped_storage())
    return storage.as_strided(
        (num_blocks, region.block_nbytes),
        (region.block_stride, 1),
        tensor.storage_offset() * tensor.element_size() + region.offset,
    )


Dims = list[tuple[int, int]]
"""(size, stride) pairs of tensor dimensions."""


def _regions_of(
    layer: str, part: int, parts: int, tensor: torch.Tensor, spec: GroupSpec
) -> list[BlockRegion]:
    """Each combination of the dimensions outside an engine block's bytes (K/V
    first, layers first) is one region; inside, the bytes must be dense."""
    shape, strides = tuple(tensor.shape), tuple(tensor.stride())
    label = layer if parts == 1 else f"{layer}[{part}]"
    where = f"KV tensor {label!r} with shape {list(shape)} and strides {list(strides)}"
    block_dim = _block_dim(shape, spec, where)
    if any(
        size > 1 and stride == 0 for size, stride in zip(shape, strides, strict=True)
    ):
        raise ValueError(f"{where}: a dimension has stride 0; cannot register it")
    inner, outer, block_stride = _split_dims(shape, strides, block_dim)
    run = 1
    for size, stride in sorted(inner, key=lambda d: d[1]):
        if stride != run:
            raise ValueError(
                f"{where}: the bytes of one engine block are not contiguous "
                f"(group {spec.group}, block dim {block_dim}); cannot register it"
            )
        run *= size
    ordered = sorted(
        [*inner, (spec.num_blocks, block_stride), *outer], key=lambda d: d[1]
    )
    for (size, stride), (_, next_stride) in itertools.pairwise(ordered):
        if size > 1 and next_stride < size * stride:
            raise ValueError(
                f"{where}: dimensions overlap in memory; cannot register it"
            )
    item = tensor.element_size()
    return [
        BlockRegion(
            layer=layer,
            part=part,
            dtype=str(tensor.dtype).removeprefix("torch."),
            offset=item
            * sum(i * stride for i, (_, stride) in zip(index, outer, strict=True)),
            block_stride=block_stride * item,
            block_nbytes=run * item,
        )
        for index in itertools.product(*(range(size) for size, _ in outer))
    ]


def _split_dims(
    shape: tuple[int, ...], strides: tuple[int, ...], block_dim: int
) -> tuple[Dims, Dims, int]:
    """The dimensions inside an engine block, those outside, and the block stride."""
    dims = [
        (shape[i], strides[i])
        for i in range(len(shape))
        if i != block_dim and shape[i] > 1
    ]
    if shape[block_dim] > 1:
        block_stride = strides[block_dim]
        inner = [d for d in dims if d[1] < block_stride]
        return inner, [d for d in dims if d[1] >= block_stride], block_stride
    # A lone engine block's stride means nothing: go by position.
    inner = [
        (shape[i], strides[i]) for i in range(block_dim + 1, len(shape)) if shape[i] > 1
    ]
    outer = [(shape[i], strides[i]) for i in range(block_dim) if shape[i] > 1]
    return inner, outer, math.prod(size for size, _ in inner)


def _block_dim(shape: tuple[int, ...], spec: GroupSpec, where: str) -> int:
    if len(shape) < 2:
        raise ValueError(f"{where}: expected at least 2 dimensions")
    dim = spec.block_dim
    if dim is None:
        if spec.num_blocks == 2 and shape[:2] == (2, 2):
            raise ValueError(
                f"{where}: with 2 engine blocks the block dimension is ambiguous; "
                "give GroupSpec.block_dim"
            )
        candidates = [i for i in (0, 1) if shape[i] == spec.num_blocks]
        if not candidates:
            raise ValueError(
                f"{where}: neither of the first two dimensions has size num_blocks="
                f"{spec.num_blocks} (group {spec.group}); give GroupSpec.block_dim"
            )
        dim = candidates[0]
    if not -len(shape) <= dim < len(shape) or shape[dim] != spec.num_blocks:
        raise ValueError(
            f"{where}: dimension {dim} is not of size num_blocks={spec.num_blocks} "
            f"(group {spec.group})"
        )
    return dim % len(shape)
