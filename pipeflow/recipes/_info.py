"""What a recipe is: :class:`RecipeInfo` (its own module so recipe modules and the table can
import it without importing the registry)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["RecipeInfo"]


@dataclass(frozen=True)
class RecipeInfo:
    """What a recipe is and what it expects.

    Attributes:
        name: the recipe name, e.g. ``"torchdata-fsspec"``.
        article: the source article, ``"000"`` ... ``"003"``.
        layout: the data layout it reads (see :data:`pipeflow.testing.datagen.LAYOUTS`).
        description: one line: storage layout, backend or tool, order of operations.
        backend: the backend or tool that moves the bytes.
        reads: the kinds of ``url`` accepted: ``("s3",)`` for an ``s3://`` URL, ``("local",)``
            for a local directory (a mount point such as Mountpoint or SageMaker Fast File
            Mode), or both.
        batch_size: when the recipe batches itself (the 002 preprocessing), its batch size;
            a DataLoader should then use ``batch_size=None``.
        options: the keyword options ``build`` accepts and their defaults (filled in by the
            registry).
        notes: the longer description: what the article did and how the recipe maps to it
            (filled in by the registry).
        option_help: what each option means (filled in by the registry).
    """

    name: str
    article: str
    layout: str
    description: str
    backend: str
    reads: tuple[str, ...] = ("s3",)
    batch_size: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    option_help: str = ""

    @property
    def local_path(self) -> bool:
        """True when the recipe reads only a local directory (a mounted path)."""
        return self.reads == ("local",)

    def yields_batches(self, overrides: dict[str, Any] | None = None) -> bool:
        """True when the pipeline yields batches (with the 002 ``preprocess=True`` option)."""
        opts = {**self.options, **(overrides or {})}
        return bool(self.batch_size and opts.get("preprocess"))
