"""The manifest ``write_shards()`` keeps next to the shards it writes (``manifest.json``).

It is rewritten (atomically) each time a shard is committed, so after a crash it lists every
shard that is complete under its final name, and how to continue::

    {
      "pipeflow_shards": 1,
      "format": "tar",
      "complete": true,
      "options": {"max_size": 268435456, "max_count": null, "name": "shard-{index:06d}"},
      "samples": 1000, "bytes": 123456789,
      "shards": [{"index": 0, "name": "shard-000000.tar", "samples": 250, "bytes": 30867456,
                  "sha256": "...", "first_key": "000000", "last_key": "000249"}, ...],
      "resume": null
    }

Shard names are relative to the directory of the manifest, so a dataset can be moved or
copied as a whole. ``resume`` is set only while the run is incomplete: ``next_shard`` is the
first shard not yet committed with every shard before it committed, and ``state`` the
pipeline's position at its first sample (when the pipeline's state is JSON-serialisable).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CorruptDataError

__all__ = ["MANIFEST_NAME", "ShardInfo", "ShardManifest"]

MANIFEST_NAME = "manifest.json"
_VERSION = 1


@dataclass(frozen=True)
class ShardInfo:
    """One committed shard.

    Attributes:
        index: its number, from 0, in pipeline order.
        name: its object name, relative to the manifest's directory.
        samples: the items it holds.
        size: its size in bytes.
        sha256: the SHA-256 of its bytes (hex).
        first_key, last_key: the keys of its first and last sample (None for keyless items).
    """

    index: int
    name: str
    samples: int
    size: int
    sha256: str
    first_key: str | None = None
    last_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["bytes"] = out.pop("size")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardInfo:
        return cls(index=int(data["index"]), name=str(data["name"]), samples=int(data["samples"]),
                   size=int(data["bytes"]), sha256=str(data["sha256"]),
                   first_key=data.get("first_key"), last_key=data.get("last_key"))


@dataclass(frozen=True)
class ShardManifest:
    """What ``write_shards()`` wrote under ``url`` (returned by it, and stored as JSON).

    Attributes:
        url: the directory or prefix the shards are under.
        shard_format: ``"tar"`` or ``"tfrecord"``.
        shards: the committed shards, by index.
        complete: True once every sample of the pipeline is in a committed shard.
        options: the options that decide shard contents (``max_size``, ``max_count``, ``name``).
        resume: where an interrupted run continues (None when complete).
    """

    url: str
    shard_format: str
    shards: tuple[ShardInfo, ...] = ()
    complete: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    resume: dict[str, Any] | None = None

    @property
    def samples(self) -> int:
        """Items in all committed shards."""
        return sum(s.samples for s in self.shards)

    @property
    def size(self) -> int:
        """Bytes in all committed shards."""
        return sum(s.size for s in self.shards)

    @property
    def resume_shard(self) -> int:
        """The shard a rerun starts encoding at: ``resume``'s ``next_shard`` when the pipeline's
        position there is stored; else 0 (the pipeline runs from its start, and the shards
        already committed are encoded again and compared)."""
        if not self.resume or self.resume.get("state") is None:
            return 0
        return int(self.resume["next_shard"])

    @property
    def samples_before_resume(self) -> int:
        """Items a rerun does not produce again: those of the shards before :attr:`resume_shard`."""
        return sum(s.samples for s in self.shards if s.index < self.resume_shard)

    def urls(self) -> list[str]:
        """The full URL of every shard, in order: ready for ``pf.from_items(...).open()``."""
        return [f"{self.url.rstrip('/')}/{s.name}" for s in self.shards]

    def to_json(self) -> str:
        """The manifest as stored: JSON with shard names relative to it, so the directory moves whole."""
        doc = {"pipeflow_shards": _VERSION, "format": self.shard_format, "complete": self.complete,
               "options": self.options, "samples": self.samples, "bytes": self.size,
               "shards": [s.to_dict() for s in self.shards], "resume": self.resume}
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, url: str) -> ShardManifest:
        """Parse a stored manifest; ``url`` is the directory it was read from."""
        try:
            doc = json.loads(text)
            if doc.get("pipeflow_shards") != _VERSION:
                raise ValueError(f"unknown manifest version {doc.get('pipeflow_shards')!r}")
            shards = tuple(sorted((ShardInfo.from_dict(s) for s in doc["shards"]),
                                  key=lambda s: s.index))
            return cls(url=url, shard_format=str(doc["format"]), shards=shards,
                       complete=bool(doc["complete"]), options=dict(doc.get("options") or {}),
                       resume=doc.get("resume"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptDataError(f"not a pipeflow shard manifest: {exc}", stage="write_shards",
                                   key=f"{url.rstrip('/')}/{MANIFEST_NAME}") from exc
