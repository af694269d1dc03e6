"""Tiering: the primary (host) tier composed with secondary tiers behind it."""

from kvoffload.tiering.config import TieringConfig, create_tiering_manager
from kvoffload.tiering.manager import TieringManager

__all__ = ["TieringConfig", "TieringManager", "create_tiering_manager"]
