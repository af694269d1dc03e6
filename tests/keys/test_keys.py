"""Keys and chained hashing: layout of OffloadKey, chaining, salts, determinism."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvoffload.keys import (
    BlockHasher,
    HashRoot,
    chunk_keys,
    make_offload_key,
    offload_key_block_hash,
    offload_key_group,
)


def test_key_is_hash_then_big_endian_group() -> None:
    key = make_offload_key(b"\x01" * 32, 258)
    assert isinstance(key, bytes)
    assert key == b"\x01" * 32 + b"\x00\x00\x01\x02"
    assert offload_key_block_hash(key) == b"\x01" * 32
    assert offload_key_group(key) == 258


@pytest.mark.parametrize("group", [-1, 2**32])
def test_group_out_of_range_is_rejected(group: int) -> None:
    with pytest.raises(ValueError, match="group"):
        make_offload_key(b"x", group)


def test_chunk_key_is_last_block_hash_and_partial_chunk_has_none() -> None:
    hashes = [bytes([i]) * 4 for i in range(7)]
    keys = chunk_keys(hashes, blocks_per_chunk=3, group=1)
    assert [offload_key_block_hash(k) for k in keys] == [hashes[2], hashes[5]]
    assert all(offload_key_group(k) == 1 for k in keys)


def test_hashes_chain_over_the_prefix() -> None:
    hasher = BlockHasher(tokens_per_block=4)
    a = hasher.hash_blocks([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = hasher.hash_blocks([1, 2, 3, 4, 5, 6, 7, 8])
    c = hasher.hash_blocks([0, 2, 3, 4, 5, 6, 7, 8])
    assert len(a) == 2 and a == b
    assert c[1] != a[1], "a different first block changes every later hash"
    assert len(a[0]) == 32


def test_incremental_hashing_equals_full_hashing() -> None:
    hasher = BlockHasher(tokens_per_block=2)
    tokens = list(range(10))
    full = hasher.hash_blocks(tokens)
    tail = hasher.hash_blocks(tokens, parent=full[1], start_block=2)
    assert full[2:] == tail


def test_salt_model_and_lora_separate_chains() -> None:
    hasher = BlockHasher(tokens_per_block=2)
    tokens = [5, 6, 7, 8]
    roots = [
        HashRoot(),
        HashRoot(cache_salt="tenant-a"),
        HashRoot(cache_salt="tenant-b"),
        HashRoot(model="other-model"),
        HashRoot(lora="adapter"),
        HashRoot(cache_salt=""),
    ]
    chains = {tuple(hasher.hash_blocks(tokens, root)) for root in roots}
    assert len(chains) == len(roots)


def test_extra_keys_enter_their_block() -> None:
    hasher = BlockHasher(tokens_per_block=2)
    plain = hasher.hash_blocks([1, 2, 3, 4])
    with_image = hasher.hash_blocks([1, 2, 3, 4], extra_keys=[(), ("img:abc",)])
    assert plain[0] == with_image[0] and plain[1] != with_image[1]


def test_sha256_hashes_are_identical_in_another_process() -> None:
    hasher = BlockHasher(tokens_per_block=3)
    here = hasher.hash_blocks(list(range(12)), HashRoot("m", "l", "s"))
    code = (
        "from kvoffload.keys import BlockHasher, HashRoot;"
        "print(','.join(h.hex() for h in BlockHasher(3).hash_blocks("
        "list(range(12)), HashRoot('m', 'l', 's'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "12345"},
    ).stdout.strip()
    assert out.split(",") == [h.hex() for h in here]


def test_fast_algorithm_chains_within_a_process() -> None:
    hasher = BlockHasher(tokens_per_block=2, algorithm="fast")
    a = hasher.hash_blocks([1, 2, 3, 4])
    assert a == hasher.hash_blocks([1, 2, 3, 4])
    assert a[1] != hasher.hash_blocks([9, 2, 3, 4])[1]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tokens_per_block": 0}, "tokens_per_block"),
        ({"algorithm": "md5"}, "algorithm"),
    ],
)
def test_bad_hasher_arguments(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"tokens_per_block": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        BlockHasher(**args)  # type: ignore[arg-type]
