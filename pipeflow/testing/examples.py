"""The objects the documentation's examples read, put on a local S3 server.

The README and docs/ name a small world (``s3://bucket/train/shard-000.tar`` ...); a reader who
copies an example needs it to exist. ``pipeflow serve --examples`` fills a local server with it,
and the test that runs every example reads the same objects, so what the docs promise is what
is tested.

Per bucket (``bucket`` and ``my-bucket``): ``train/shard-000.tar`` ... ``shard-099.tar`` (tar
shards of two samples, ``{key}.image.png`` + ``{key}.label.cls``), ``raw/`` and ``jpeg/`` (one
object per field: ``{key}.jpg``, ``{key}.cls``), ``images/`` (``{key}.jpg``) and ``pairs/``
(``{i}.image``, ``{i}.label``): 128 objects, about 60 KB.
"""

from __future__ import annotations

import io
import tarfile

from .s3server import LocalS3

__all__ = ["EXAMPLE_BUCKETS", "example_objects", "put_examples"]

#: the buckets the examples name
EXAMPLE_BUCKETS = ("bucket", "my-bucket")


def _image(fmt: str, size: int, color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (size, size), color).save(out, format=fmt)
    return out.getvalue()


def _tar(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def example_objects() -> dict[str, bytes]:
    """Key -> bytes of the objects one example bucket holds."""
    png, jpg = _image("PNG", 8, (10, 200, 30)), _image("JPEG", 16, (200, 10, 30))
    fields = (("image.png", png), ("label.cls", b"7"))
    shards = {f"train/shard-{n:03d}.tar": _tar({f"{n:03d}{i}.{name}": data for i in range(2)
                                                for name, data in fields})
              for n in range(100)}
    singles = {f"{prefix}/{i:06d}.{ext}": (jpg if ext == "jpg" else b"3")
               for prefix in ("raw", "jpeg") for i in range(4) for ext in ("jpg", "cls")}
    images = {f"images/{i:06d}.jpg": jpg for i in range(4)}
    pairs = {f"pairs/{i}.{name}": data for i in range(4)
             for name, data in (("image", png), ("label", b"3"))}
    return {**shards, **singles, **images, **pairs}


def put_examples(server: LocalS3) -> list[str]:
    """Create :data:`EXAMPLE_BUCKETS` on ``server`` and put :func:`example_objects` in each;
    returns the bucket URLs."""
    objects = example_objects()
    for bucket in EXAMPLE_BUCKETS:
        server.make_bucket(bucket)
        server.put_many(bucket, objects)
    return [f"s3://{bucket}/" for bucket in EXAMPLE_BUCKETS]
