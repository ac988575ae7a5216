"""Named recipes: the articles' training-data pipelines, rebuilt from pipeflow stages.

Recipes that are a shared chain read with different backends are rows of one table
(:mod:`pipeflow.recipes._table`: ``wds-s3fs`` and ``wds-ffm`` differ only in the backend). A
recipe with logic of its own is one module in this package (``single_s5cmd.py`` defines
``single-s5cmd``) with an ``INFO`` (:class:`RecipeInfo`) and a ``build(url, **options) ->
Pipeline`` function. Both ship in the wheel and import no SDK at import time.

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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ._info import RecipeInfo
from ._table import TABLE, TableRecipe

if TYPE_CHECKING:
    from ..pipeline import Pipeline

__all__ = ["RecipeInfo", "UnknownRecipeError", "get", "list", "load", "names"]


class UnknownRecipeError(ConfigError):
    """No recipe has the requested name; the message suggests close matches."""


def _module_name(name: str) -> str:
    return name.replace("-", "_")


def _module_names() -> builtins.list[str]:
    return [m.name.replace("_", "-") for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]


def names() -> builtins.list[str]:
    """All recipe names, sorted."""
    return sorted({*_module_names(), *TABLE})


def _entry(name: str) -> Any:
    """The recipe's table row or module (both have ``INFO`` and ``build(url, **options)``)."""
    if isinstance(name, str) and name in TABLE:
        return TABLE[name]
    if not isinstance(name, str) or name not in _module_names():
        known = names()
        close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UnknownRecipeError(f"no recipe named {name!r}; {hint}known recipes: {', '.join(known)}")
    return importlib.import_module(f"{__name__}.{_module_name(name)}")


def _without_prefix(doc: str, name: str) -> str:
    """A recipe module's docstring without its ``"name (article NNN): "`` opening."""
    text = " ".join(inspect.cleandoc(doc).split())
    head, sep, rest = text.partition("): ")
    return rest if sep and head.startswith(f"{name} (article") else text


def _filled(entry: Any, name: str) -> RecipeInfo:
    info: RecipeInfo = entry.INFO
    if isinstance(entry, TableRecipe):
        return replace(info, options=dict(entry.options), notes=entry.notes, option_help=entry.option_help)
    params = inspect.signature(entry.build).parameters.values()
    options = {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    help_text = " ".join(inspect.cleandoc(entry.build.__doc__ or "").split()).removeprefix("Args: ")
    return replace(info, options=options, notes=_without_prefix(entry.__doc__ or info.description, name),
                   option_help=help_text)


def get(name: str) -> RecipeInfo:
    """The :class:`RecipeInfo` of one recipe, with its options, notes and option help filled in.

    Raises:
        UnknownRecipeError: no such recipe (the message suggests close matches).
    """
    return _filled(_entry(name), name)


def list() -> builtins.list[RecipeInfo]:  # noqa: A001 - public as pipeflow.recipes.list(), always qualified
    """Every recipe's :class:`RecipeInfo`, sorted by article then name."""
    infos = [get(n) for n in names()]
    return sorted(infos, key=lambda i: (i.article, i.name))


def _check_kinds(name: str, defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    """An option whose default is a bool or an int takes one of its kind: a recipe's chain
    compares and counts with it, and a string there (``pipeflow run -o shuffle_buffer=ten``)
    would fail deep inside as a bare ``TypeError``."""
    for key, value in overrides.items():
        default = defaults[key]
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "True or False"
        elif isinstance(default, int):
            ok, kind = isinstance(value, int) and not isinstance(value, bool), "an int"
        else:
            continue
        if not ok:
            raise ConfigError(f"recipe {name!r}: option {key!r} must be {kind} (default "
                              f"{default!r}), got {value!r}")


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
    entry = _entry(name)
    info = _filled(entry, name)
    unknown = sorted(set(overrides) - set(info.options))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, builtins.list(info.options), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"recipe {name!r} has no option {', '.join(hints)}; "
                          f"options: {', '.join(info.options) or 'none'}")
    _check_kinds(name, info.options, overrides)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"recipe {name!r} needs a url, got {url!r}")
    kind = "s3" if url.startswith("s3://") else "local"
    if kind not in info.reads:
        if kind == "s3":
            raise ConfigError(f"recipe {name!r} reads a mounted local path (Mountpoint / Fast File "
                              f"Mode), not {url!r}; pass the mount directory")
        raise ConfigError(f"recipe {name!r} reads from S3; pass an s3://bucket/prefix URL, not {url!r}")
    return entry.build(url, **overrides)
