"""Configuration parsed once at the edge: sizes, seconds and per-request parameters."""

from kvoffload.config.request_params import ALL_TIERS, RequestParams, TierSelector
from kvoffload.config.seconds import finite_seconds
from kvoffload.config.sizes import parse_size

__all__ = ["ALL_TIERS", "RequestParams", "TierSelector", "finite_seconds", "parse_size"]
