"""Routing across engines: a prefix index a KV-aware router embeds, fed by the
KV events the engines publish (see docs/fleet.md)."""

from kvoffload.routing.prefix_index import PrefixIndex, PrefixMatch

__all__ = ["PrefixIndex", "PrefixMatch"]
