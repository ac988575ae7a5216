"""The recipes that are one shared chain and a backend: one row each.

Article 001's WebDataset and DataPipes chains, article 002's random access and article 003's
TFRecord files were each measured with several storage clients; the pipeline is the same and only
the backend differs. Each such recipe is a :class:`TableRecipe` row here instead of a module.
Recipes with logic of their own (a batched ``s5cmd run``, a pipe, a disk cache) stay modules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..backends import get_backend
from ._common import (
    PREPROCESS_BATCH,
    random_access_chain,
    tfrecord_files_chain,
    torchdata_chain,
    webdataset_chain,
)
from ._info import RecipeInfo

if TYPE_CHECKING:  # torch loads only when a recipe is built, not to list or look one up
    from ..pipeline import Pipeline

__all__ = ["TABLE", "TableRecipe"]


@dataclass(frozen=True)
class TableRecipe:
    """One recipe: ``chain(url, backend, **options, **fixed)``.

    Attributes:
        INFO: the recipe's metadata (its ``options`` are filled from :attr:`options`).
        chain: the shared pipeline builder from :mod:`pipeflow.recipes._common`.
        backend: the backend name the chain reads with.
        options: what users may set and the defaults; an option named ``backend`` replaces
            :attr:`backend`.
        fixed: chain arguments the recipe pins (not options).
        backend_options: options of the backend (then a backend object is built).
        notes: the longer description: what the article did and how this maps to it.
        option_help: what each option means.
    """

    INFO: RecipeInfo
    chain: Callable[..., Pipeline]
    backend: str
    options: Mapping[str, Any]
    notes: str
    option_help: str
    fixed: Mapping[str, Any] = field(default_factory=dict)
    backend_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "fixed", MappingProxyType(dict(self.fixed)))
        object.__setattr__(self, "backend_options", MappingProxyType(dict(self.backend_options)))

    def build(self, url: str, **options: Any) -> Pipeline:
        """The pipeline reading ``url`` (options already checked by the registry)."""
        values = {**self.options, **options}
        name = values.pop("backend", self.backend)
        backend = get_backend(name, **self.backend_options) if self.backend_options else name
        return self.chain(url, backend, **values, **self.fixed)


_WDS = {"seed": 0, "shuffle_buffer": 10}
_WDS_HELP = ("``url`` the prefix (or mounted directory) of the ``.tar`` shards; ``seed`` the shuffle "
             "seed (combined with the epoch); ``shuffle_buffer`` the sample shuffle buffer (10 in "
             "the article)")
_TORCHDATA = {"seed": 0, "shuffle_buffer": 10, "cycle": True}
_TORCHDATA_HELP = _WDS_HELP + "; ``cycle`` repeat the shard list forever (stop by steps)"
_RANDOM = {"seed": 0, "workers": 16, "preprocess": False}
_RANDOM_HELP = ("``url`` the prefix (or mounted directory) of ``{key}.jpg``/``{key}.cls``; ``seed`` "
                "the permutation seed; ``workers`` requests in flight per DataLoader worker; "
                "``preprocess`` decode, resize to 224x224 and batch 128 (then use "
                "``DataLoader(batch_size=None)``)")
_TFRECORD = {"seed": 0, "shuffle_files": True}
_TFRECORD_HELP = ("``url`` the prefix (or mounted directory) of the ``.tfrecord`` files; ``seed`` the "
                  "file shuffle seed (combined with the epoch); ``shuffle_files`` shuffle the file "
                  "list every epoch")


def _info(name: str, article: str, layout: str, backend: str, description: str, *,
          reads: tuple[str, ...] = ("s3",), batch_size: int | None = None) -> RecipeInfo:
    return RecipeInfo(name=name, article=article, layout=layout, backend=backend, reads=reads,
                      batch_size=batch_size, description=description)


#: every table recipe, by name
TABLE: dict[str, TableRecipe] = {row.INFO.name: row for row in (
    # ---- article 001: WebDataset ------------------------------------------------------------
    TableRecipe(
        _info("wds-boto3", "001", "wds", "boto3", "tar shards pulled into memory with boto3 "
              "download_fileobj, shard shuffle, untar, group, shuffle(10)"),
        webdataset_chain, "boto3", _WDS, backend_options={"method": "download_fileobj"},
        option_help=_WDS_HELP,
        notes="tar shards pulled whole into memory with boto3 ``download_fileobj`` (the "
              "article's overridden ``url_opener``), then expanded."),
    TableRecipe(
        _info("wds-s3fs", "001", "wds", "s3fs", "tar shards opened with s3fs, shard shuffle, "
              "untar, group, shuffle(10)"),
        webdataset_chain, "s3fs", _WDS, option_help=_WDS_HELP,
        notes="tar shards opened as files with s3fs (``fs.open(url, 'rb')``)."),
    TableRecipe(
        _info("wds-s3-plugin", "001", "wds", "s3torchconnector", "tar shards streamed by the CRT "
              "client (s3torchconnector, the plug-in's successor), shuffled URLs, untar, pairs"),
        webdataset_chain, "s3torchconnector", {"seed": 0, "shuffle_buffer": 0},
        option_help=_WDS_HELP.replace("(10 in the article)", "(0: none, as in the article)"),
        notes="the retired Amazon S3 PyTorch plug-in's ``S3IterableDataset(urls, "
              "shuffle_urls=True)``, consecutive members paired into samples. The CRT client of "
              "s3torchconnector replaces the plug-in. The article adds no sample shuffle buffer."),
    TableRecipe(
        _info("wds-ffm", "001", "wds", "local", "tar shards under a mounted path, shard shuffle, "
              "untar, group, shuffle(10)", reads=("local",)),
        webdataset_chain, "local", _WDS, option_help=_WDS_HELP,
        notes="tar shards under a mounted path (SageMaker Fast File Mode), read as local files."),
    # ---- article 001: DataPipes -------------------------------------------------------------
    TableRecipe(
        _info("torchdata-iopath", "001", "wds", "iopath", "shuffle+cycle shard URLs, iopath "
              "opener, untar, group pairs, map to dict, shuffle(10)"),
        torchdata_chain, "iopath", _TORCHDATA, option_help=_TORCHDATA_HELP,
        notes="``IoPathFileOpener``: shuffle and cycle the shard URLs, open them with iopath's S3 "
              "handler, ``load_from_tar``, group members in pairs, map to a dict, ``shuffle(10)``."),
    TableRecipe(
        _info("torchdata-fsspec", "001", "wds", "fsspec", "shuffle+cycle shard URLs, fsspec "
              "opener, untar, group pairs, map to dict, shuffle(10)"),
        torchdata_chain, "fsspec", _TORCHDATA, option_help=_TORCHDATA_HELP,
        notes="``FSSpecFileOpener``: the same chain as torchdata-iopath with an fsspec (s3fs) opener."),
    TableRecipe(
        _info("torchdata-s3fileloader", "001", "wds", "s3torchconnector", "shuffle+cycle shard "
              "URLs, CRT client (S3FileLoader's successor), untar, group pairs, map to dict, "
              "shuffle(10)"),
        torchdata_chain, "s3torchconnector", _TORCHDATA, option_help=_TORCHDATA_HELP,
        notes="``S3FileLoader`` (the plug-in reborn as a DataPipe). Its successor, the CRT client "
              "of s3torchconnector, opens the shuffled, cycled shard URLs; then the same chain as "
              "torchdata-fsspec."),
    TableRecipe(
        _info("torchdata-file", "001", "wds", "local", "shard files on a mounted path in order, "
              "file opener, untar, group pairs, map to dict, shuffle(10)", reads=("local",)),
        torchdata_chain, "local", {**_TORCHDATA, "cycle": False}, fixed={"shuffle_urls": False},
        option_help=_TORCHDATA_HELP + " (the article's FFM variant does not)",
        notes="``FileOpener`` on a mounted path (SageMaker Fast File Mode): the article opens the "
              "local shard paths in order (no URL shuffle or cycle), ``load_from_tar``, pairs, map "
              "to a dict, ``shuffle(10)``."),
    # ---- article 002: random access to single objects ----------------------------------------
    TableRecipe(
        _info("fsspec-random", "002", "jpeg", "fsspec", "random access to single JPEG objects "
              "through fsspec (s3fs), shuffled every epoch; optional decode+resize 224+batch 128",
              batch_size=PREPROCESS_BATCH),
        random_access_chain, "fsspec", _RANDOM, option_help=_RANDOM_HELP,
        notes="the fsspec-based data loader (TorchData DataPipes on fsspec): random access to "
              "single JPEG objects through s3fs."),
    TableRecipe(
        _info("mountpoint", "002", "jpeg", "local", "JPEG files under a mounted path read in a "
              "random order, 16 reads in flight; optional decode+resize 224+batch 128",
              reads=("local",), batch_size=PREPROCESS_BATCH),
        random_access_chain, "local", _RANDOM, option_help=_RANDOM_HELP,
        notes="JPEG files under a Mountpoint for Amazon S3 mount, read as local files in a random "
              "order (metadata cached, no data cache)."),
    TableRecipe(
        _info("s3connector-map", "002", "jpeg", "s3torchconnector", "random access to single "
              "JPEG objects with the CRT client, shuffled every epoch, 16 GETs in flight; optional "
              "decode+resize 224+batch 128", batch_size=PREPROCESS_BATCH),
        random_access_chain, "s3torchconnector", _RANDOM, option_help=_RANDOM_HELP,
        notes="the S3 Connector for PyTorch's map-style dataset: random access to single ~115 KB "
              "JPEG objects, a new permutation every epoch, many GETs in flight."),
    # ---- article 003: TFRecord files ---------------------------------------------------------
    TableRecipe(
        _info("tfrecord-ffm", "003", "tfrecord", "local", "TFRecord files under a mounted path, "
              "per-epoch seeded file shuffle, sharded by rank and worker, streamed record by record",
              reads=("local",)),
        tfrecord_files_chain, "local", _TFRECORD, option_help=_TFRECORD_HELP,
        notes="TFRecord files read from a SageMaker Fast File Mode mount, the file list shuffled "
              "per epoch with a recorded seed and sharded across ranks and workers. To change the "
              "data mix during training, build one pipeline per source and combine them with "
              "``pipeflow.mix(pipelines, weights=f(epoch, step))``."),
    TableRecipe(
        _info("tfrecord-s3", "003", "tfrecord", "boto3", "TFRecord files streamed directly from "
              "S3, per-epoch seeded file shuffle, sharded by rank and worker"),
        tfrecord_files_chain, "boto3", {**_TFRECORD, "backend": "boto3"},
        option_help=_TFRECORD_HELP + "; ``backend`` the S3 backend",
        notes="TFRecord files streamed directly from S3 (one streaming GET per file), with the "
              "same per-epoch seeded file shuffle and sharding as tfrecord-ffm."),
)}
