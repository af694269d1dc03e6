"""What a tier learns of its application's 0s, read through `ZeroTrust`."""

from __future__ import annotations

from kvoffload.policies.zero_hints import OWN, mark_of
from kvoffload.policies.zero_trust import ZeroTrust

from .support import k


def test_the_worth_of_the_policys_victims_follows_the_tiers_evictions() -> None:
    """Scenario: a tier of 10 chunks; its policy's first 10 victims were all
    stored again (`v` = 1). Then believed 0s take the evictions, 50 of them,
    and the policy chooses 2 victims that never come back. `v` reads the
    victims of about the last two turnovers of the tier's evictions, not the
    policy's last 20 victims, so the old ones no longer stand for it."""
    trust = ZeroTrust(10)
    trust.evicted([], [], [k(i) for i in range(10)])
    assert trust.stored([k(i) for i in range(10)]) == []
    assert trust.victim_rate == 1.0
    for i in range(100, 150):
        trust.evicted([k(i)], [mark_of(trust.clock, OWN)], [])
    trust.evicted([], [], [k(200), k(201)])
    assert trust.victim_rate < 0.2  # 0.83 counting the last 20 victims
