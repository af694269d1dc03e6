"""The Redis tier on a Redis Cluster (`cluster: true`): chunks spread over the
nodes by slot, batches that span nodes, and a node that dies. The contract suite
runs on a cluster too (`make_tier`'s `redis-cluster`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from kvoffload import LookupResult
from kvoffload.tiers.secondary import ArrayChunkBuffer, RedisTierConfig
from kvoffload.tiers.secondary.redis_tier import RedisTier
from kvoffload.tiers.secondary.redis_topologies import RedisClusterServers
from tests.tiers.secondary.secondary_support import (
    GROUPS,
    Jobs,
    key,
    payload,
    resolve,
)
from tests.tiers.secondary.test_redis_refusals import server_full
from tests.tiers.secondary.test_redis_tier import Clock, closed_port_url

IDS = list(range(1, 13))


def cluster_tier(url: str, buffer: ArrayChunkBuffer, **options: object) -> RedisTier:
    config = RedisTierConfig(url, cluster=True, timeout_s=2.0, **options)  # type: ignore[arg-type]
    return RedisTier(config, buffer, "m")


def store_all(tier: RedisTier, buffer: ArrayChunkBuffer) -> None:
    for slot, i in enumerate(IDS):
        buffer.slot_view(slot)[: GROUPS[0]] = payload(key(i), GROUPS[0])
    assert Jobs(tier).store([key(i) for i in IDS], list(range(len(IDS)))).success


def node_of(cluster: RedisClusterServers, tier: RedisTier, i: int) -> int:
    """Index of the node that holds chunk `i`."""
    name = tier.redis_key(key(i))
    for n, node in enumerate(cluster.nodes):
        # KEYS answers from the node's own data (EXISTS would redirect).
        if redis.Redis(port=node.port).keys(name):
            return n
    raise AssertionError(f"chunk {i} is on no node")


def test_a_batch_spans_the_nodes_and_loads_back_whole(
    redis_cluster: RedisClusterServers,
    redis_cluster_url: str,
    buffer: ArrayChunkBuffer,
) -> None:
    tier = cluster_tier(redis_cluster_url, buffer)
    store_all(tier, buffer)
    holders = {node_of(redis_cluster, tier, i) for i in IDS}
    assert len(holders) == len(redis_cluster.nodes), "one batch, every node"
    assert all(resolve(tier, key(i)) is LookupResult.HIT for i in IDS)

    buffer.slot_view(15)[:] = b"\0" * len(buffer.slot_view(15))
    slots = [15] + [14] * (len(IDS) - 1)  # one slot checked, the rest overwritten
    assert Jobs(tier).load([key(i) for i in IDS], slots).success
    assert bytes(buffer.slot_view(15)[: GROUPS[0]]) == payload(key(IDS[0]), GROUPS[0])
    tier.shutdown()


def test_a_corrupt_chunk_on_one_node_is_a_miss_and_is_deleted(
    redis_cluster: RedisClusterServers,
    redis_cluster_url: str,
    buffer: ArrayChunkBuffer,
) -> None:
    tier = cluster_tier(redis_cluster_url, buffer)
    store_all(tier, buffer)
    bad = IDS[3]
    node = redis.Redis(port=redis_cluster.nodes[node_of(redis_cluster, tier, bad)].port)
    name = tier.redis_key(key(bad))
    value = bytearray(node.get(name))  # type: ignore[arg-type]
    value[-1] ^= 0xFF
    node.set(name, bytes(value))

    result = Jobs(tier).load([key(i) for i in IDS], [14] * len(IDS))
    assert result.failed_keys == (key(bad),)
    assert not node.exists(name)
    tier.shutdown()


def test_a_full_node_skips_only_its_own_chunks(
    redis_cluster: RedisClusterServers,
    redis_cluster_url: str,
    buffer: ArrayChunkBuffer,
) -> None:
    """Scenario: one node of the cluster is full and may evict nothing (OOM to
    every write); a batch spanning the nodes stores the chunks of the others,
    skips (and counts) those of the full one, and the cluster stays up."""
    tier = cluster_tier(redis_cluster_url, buffer)
    for slot, i in enumerate(IDS):
        buffer.slot_view(slot)[: GROUPS[0]] = payload(key(i), GROUPS[0])
    node = redis_cluster.nodes[0].port
    client = RedisCluster.from_url(redis_cluster_url)
    full = [
        i for i in IDS if client.get_node_from_key(tier.redis_key(key(i))).port == node
    ]
    client.close()
    assert full and len(full) < len(IDS)
    with server_full(redis.Redis(port=node)):
        result = Jobs(tier).store([key(i) for i in IDS], list(range(len(IDS))))
    assert result.failed_keys == tuple(key(i) for i in full)
    stats = tier.get_stats()
    assert (stats.store_skipped, stats.failures) == (len(full), 0)
    assert stats.chunks_stored == len(IDS) - len(full)
    assert tier.connected
    tier.shutdown()


def test_a_dead_node_gives_misses_never_errors(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    with RedisClusterServers(str(tmp_path)) as cluster:
        tier = cluster_tier(cluster.url, buffer, backoff_initial_s=0.05)
        store_all(tier, buffer)
        lost = [i for i in IDS if node_of(cluster, tier, i) == 1]
        assert lost
        cluster.nodes[1].kill()

        result = Jobs(tier).load([key(i) for i in IDS], [14] * len(IDS))
        assert key(lost[0]) in result.failed_keys, "a chunk on the dead node: a miss"
        assert tier.get_stats().failures >= 1
        tier.shutdown()


def test_an_unreachable_cluster_at_start_up_gives_misses(
    buffer: ArrayChunkBuffer,
) -> None:
    """The cluster client asks for the slot map when made: that happens on first
    use, so a cluster that is down does not stop the engine from starting."""
    config = RedisTierConfig(closed_port_url(), cluster=True, timeout_s=0.2)
    tier = RedisTier(config, buffer, "m", Clock())
    assert resolve(tier, key(1)) is LookupResult.MISS
    assert Jobs(tier).store([key(2)], [0]).failed_keys == (key(2),)
    assert not tier.connected
    tier.shutdown()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://cache:notaport", r"url: 'redis://cache:notaport': the port"),
        ("redis://cache:6379?db=x", r"url: 'redis://cache:6379\?db=x': the database"),
        ("redis://cache:6379/1", r"url: 'redis://cache:6379/1': a Redis Cluster has"),
    ],
)
def test_a_malformed_cluster_url_still_stops_start_up(
    buffer: ArrayChunkBuffer, url: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RedisTier(RedisTierConfig(url, cluster=True), buffer, "m")
