"""Building blocks shared by the recipe modules.

Everything a recipe hands to a stage is a module-level function or a ``functools.partial`` of
one, so recipes pickle into DataLoader workers under any start method.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from .._usercache import dataset_cache_dir
from ..errors import ConfigError, MissingFieldError

if TYPE_CHECKING:  # torch loads only when a recipe is built, not to list or look one up
    from ..pipeline import Pipeline

__all__ = ["companions", "default_cache_dir", "list_with_suffix", "preprocess_002", "to_sample"]

#: the 002 article's preprocessing: decode JPEG, resize to 224x224x3, batch 128
PREPROCESS_SIZE = 224
PREPROCESS_BATCH = 128


def _url(item: Any) -> str:
    return item if isinstance(item, str) else item.url


def list_with_suffix(url: str, suffix: str, *, backend: Any = None) -> Pipeline:
    """The objects under ``url`` whose name ends with ``suffix``, sorted by URL.

    A prefix with none of them (data of another layout) is an ``ObjectNotFoundError`` that
    shows the names found there, not an epoch of no samples."""
    from ..pipeline import list_objects

    root = url if url.endswith("/") else url + "/"
    return list_objects(root, pattern="*" + suffix, backend=backend)


def _companions(first: str, fields: tuple[str, ...], item: Any) -> list[str]:
    url = _url(item)
    stem = url[: -len(first) - 1]
    return [f"{stem}.{field}" for field in fields]


def companions(fields: tuple[str, ...]) -> Any:
    """``f(item)`` mapping the URL of a sample's first object (``.../7.image``) to the URLs of
    all its objects (``[.../7.image, .../7.label]``), for one-object-per-field layouts."""
    return functools.partial(_companions, fields[0], fields)


def _to_sample(fields: tuple[str, ...], sample: dict[str, Any]) -> dict[str, Any]:
    missing = [field for field in fields if field not in sample]
    if missing:  # data of another layout: a typed error that says which, not a KeyError
        present = tuple(k for k in sample if not k.startswith("__"))
        raise MissingFieldError(
            f"this recipe reads samples with the fields {', '.join(fields)} (the layout `pipeflow "
            f"make-data` writes for it); this one has {', '.join(present) or 'none'}",
            key=str(sample.get("__key__", "")), field=",".join(missing), fields=present)
    out = {"__key__": sample["__key__"], "__url__": sample.get("__url__", "")}
    for field in fields:
        out[field] = sample[field]
    return out


def to_sample(fields: tuple[str, ...]) -> Any:
    """``f(sample)`` keeping the key, the URL and ``fields`` (the articles' "map to dict")."""
    return functools.partial(_to_sample, tuple(fields))


def preprocess_002(pipeline: Pipeline, *, enabled: bool, size: int = PREPROCESS_SIZE,
                   batch_size: int = PREPROCESS_BATCH) -> Pipeline:
    """The 002 article's preprocessing: decode the JPEG and the class, resize to ``size`` x
    ``size`` (x3), and collate batches of ``batch_size`` (the last one may be short)."""
    if not enabled:
        return pipeline
    return pipeline.decode("torch", resize=size).batch(batch_size, collate=True)


def default_cache_dir(url: str) -> str:
    """A per-dataset cache directory under the user's cache directory
    (``$XDG_CACHE_HOME/pipeflow/datasets/<hash of url>``), listed by ``pipeflow cache ls``."""
    return dataset_cache_dir(url)


#: a shuffle buffer that holds every URL of a listing: a full permutation per epoch
ALL = 1 << 20
WDS_FIELDS = ("image", "label")


def webdataset_chain(url: str, backend: Any, *, seed: int, shuffle_buffer: int,
                     list_backend: Any = None) -> Pipeline:
    """Article 001's ``WebDataset(urls, shardshuffle=True).shuffle(10)``: shuffle the shard
    list (the same permutation on every rank and worker, reseeded every epoch), split it by
    rank and worker, stream each shard, expand the tar, group members into samples, then a
    shuffle buffer of ``shuffle_buffer`` samples."""
    pipeline = (list_with_suffix(url, ".tar", backend=list_backend)
                .shuffle(ALL, seed=seed)
                .shard_by_rank()
                .open(backend=backend)
                .untar()
                .group_pairs(required=WDS_FIELDS)
                .map(to_sample(WDS_FIELDS)))
    return pipeline.shuffle(shuffle_buffer, seed=seed) if shuffle_buffer > 1 else pipeline


def torchdata_chain(url: str, backend: Any, *, seed: int, shuffle_buffer: int, cycle: bool,
                    shuffle_urls: bool = True) -> Pipeline:
    """Article 001's DataPipes: ``IterableWrapper(urls).shuffle().cycle()``, an opener,
    ``load_from_tar()``, ``groupby(... group_size=2)``, ``map`` to a dict, ``shuffle(10)``.

    URLs are split by rank and worker first (DataPipes without a sharding filter would read
    every shard in every worker). ``cycle=True`` repeats forever, as in the article: stop the
    training loop by steps.
    """
    pipeline = list_with_suffix(url, ".tar", backend=backend).shard_by_rank()
    if shuffle_urls:
        pipeline = pipeline.shuffle(ALL, seed=seed)
    if cycle:
        pipeline = pipeline.repeat()
    pipeline = (pipeline.open(backend=backend)
                .untar()
                .group_pairs(required=WDS_FIELDS)
                .map(to_sample(WDS_FIELDS)))
    return pipeline.shuffle(shuffle_buffer, seed=seed) if shuffle_buffer > 1 else pipeline


JPEG_FIELDS = ("jpg", "cls")


def random_access_chain(url: str, backend: Any, *, seed: int, workers: int, preprocess: bool,
                        cache: tuple[str, int] | None = None) -> Pipeline:
    """Article 002's random access to single JPEG objects: a fresh permutation of the samples
    every epoch (a map-style dataset with a random sampler), split by rank and worker, and
    ``workers`` requests in flight per DataLoader worker, one GET per object; optionally through
    a disk cache; then the optional preprocessing."""
    pipeline = (list_with_suffix(url, ".jpg", backend=backend)
                .shuffle(ALL, seed=seed)
                .shard_by_rank()
                .map(companions(JPEG_FIELDS)).unbatch())
    if cache is not None:
        pipeline = pipeline.cache(cache[0], max_bytes=cache[1], backend=backend, workers=workers)
    else:
        pipeline = pipeline.open(backend=backend, read=True, workers=workers)
    pipeline = pipeline.group_pairs(required=JPEG_FIELDS).map(to_sample(JPEG_FIELDS))
    return preprocess_002(pipeline, enabled=preprocess)


def example_to_sample(record: dict[str, Any]) -> dict[str, Any]:
    """A parsed ``tf.train.Example`` of the generated TFRecord data -> ``{"__key__", "__url__",
    "image", "label"}`` (the generator stores the sample key in the ``key`` feature)."""
    def one(name: str) -> bytes:
        values = record[name]
        if len(values) != 1:
            raise ConfigError(f"feature {name!r} of {record.get('__key__')!r} has {len(values)} values")
        return values[0]

    return {"__key__": one("key").decode(), "__url__": record.get("__url__", ""),
            "image": one("image"), "label": one("label")}


def tfrecord_files_chain(url: str, backend: Any, *, seed: int, shuffle_files: bool) -> Pipeline:
    """Article 003's generator over TFRecord files: every epoch the file list is shuffled with a
    seed derived from ``(seed, epoch)`` (the same on every rank, so it can be logged and
    replayed), then split by rank and worker, and the files are streamed record by record."""
    pipeline = list_with_suffix(url, ".tfrecord", backend=backend)
    if shuffle_files:
        pipeline = pipeline.shuffle(ALL, seed=seed)
    return (pipeline.shard_by_rank()
            .open(backend=backend)
            .read_tfrecord()
            .map(example_to_sample))
