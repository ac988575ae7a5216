"""Sinks: terminal operations that run a pipeline and write what it yields."""

from __future__ import annotations

from .manifest import MANIFEST_NAME, ShardInfo, ShardManifest

__all__ = ["MANIFEST_NAME", "ShardInfo", "ShardManifest"]
