"""Named recipes: the articles' training-data pipelines, rebuilt from pipeflow stages.

Every recipe is one module in this package (``single_boto3.py`` defines ``single-boto3``) with
an ``INFO`` (:class:`RecipeInfo`) and a ``build(url, **options) -> Pipeline`` function. The
modules ship in the wheel and import no SDK at import time.

Example::

    import pipeflow.recipes as recipes

    for info in recipes.list():
        print(info.name, info.article, info.layout)
    pipeline = recipes.load("torchdata-fsspec", url="s3://bucket/wds/")
    loader = torch.utils.data.DataLoader(pipeline, batch_size=4, num_workers=2)
"""

from __future__ import annotations

import builtins
import difflib
import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..pipeline import Pipeline

__all__ = ["RecipeInfo", "UnknownRecipeError", "get", "list", "load", "names"]


class UnknownRecipeError(ConfigError):
    """No recipe has the requested name; the message suggests close matches."""


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
            registry from the signature).
    """

    name: str
    article: str
    layout: str
    description: str
    backend: str
    reads: tuple[str, ...] = ("s3",)
    batch_size: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def local_path(self) -> bool:
        """True when the recipe reads only a local directory (a mounted path)."""
        return self.reads == ("local",)

    def yields_batches(self, overrides: dict[str, Any] | None = None) -> bool:
        """True when the pipeline yields batches (with the 002 ``preprocess=True`` option)."""
        opts = {**self.options, **(overrides or {})}
        return bool(self.batch_size and opts.get("preprocess"))


def _module_name(name: str) -> str:
    return name.replace("-", "_")


def names() -> builtins.list[str]:
    """All recipe names, sorted."""
    found = [m.name.replace("_", "-") for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    return sorted(found)


def _module(name: str) -> ModuleType:
    if not isinstance(name, str) or name not in names():
        known = names()
        close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UnknownRecipeError(f"no recipe named {name!r}; {hint}known recipes: {', '.join(known)}")
    return importlib.import_module(f"{__name__}.{_module_name(name)}")


def _options(build: Any) -> dict[str, Any]:
    params = inspect.signature(build).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def get(name: str) -> RecipeInfo:
    """The :class:`RecipeInfo` of one recipe.

    Raises:
        UnknownRecipeError: no such recipe (the message suggests close matches).
    """
    module = _module(name)
    info: RecipeInfo = module.INFO
    return replace(info, options=_options(module.build))


def list() -> builtins.list[RecipeInfo]:  # noqa: A001 - the name the issue asks for
    """Every recipe's :class:`RecipeInfo`, sorted by article then name."""
    infos = [get(n) for n in names()]
    return sorted(infos, key=lambda i: (i.article, i.name))


def load(name: str, url: str, **overrides: Any) -> Pipeline:
    """Build the pipeline of recipe ``name`` reading from ``url``.

    Args:
        name: a recipe name (see :func:`list`).
        url: the dataset root: ``s3://bucket/prefix`` or, for ``local_path`` recipes, a
            directory.
        **overrides: recipe options (see ``get(name).options``), e.g. ``seed=1``,
            ``preprocess=True`` for the 002 recipes.

    Raises:
        UnknownRecipeError: no such recipe.
        ConfigError: an unknown option or a URL of the wrong kind.
        MissingDependencyError: the recipe's backend or tool is not installed.
    """
    module = _module(name)
    info = get(name)
    unknown = sorted(set(overrides) - set(info.options))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, builtins.list(info.options), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"recipe {name!r} has no option {', '.join(hints)}; "
                          f"options: {', '.join(info.options) or 'none'}")
    if not isinstance(url, str) or not url:
        raise ConfigError(f"recipe {name!r} needs a url, got {url!r}")
    kind = "s3" if url.startswith("s3://") else "local"
    if kind not in info.reads:
        if kind == "s3":
            raise ConfigError(f"recipe {name!r} reads a mounted local path (Mountpoint / Fast File "
                              f"Mode), not {url!r}; pass the mount directory")
        raise ConfigError(f"recipe {name!r} reads from S3; pass an s3://bucket/prefix URL, not {url!r}")
    return module.build(url, **overrides)
