"""001/002: torchdata DataPipes with ``FSSpecFileOpener`` (torchdata 0.9, its own venv).

torchdata 0.10 removed DataPipes and pipeflow's environment has 0.11, so this peer runs in a
separate virtual environment (:func:`ensure_venv`) that has torchdata 0.9.0 and sees every other
package of the main environment through a ``.pth`` file. The graphs are the article's:

* shards: ``IterableWrapper(urls).shuffle().sharding_filter()`` -> ``FSSpecFileOpener`` ->
  ``load_from_tar()`` -> ``groupby(key, group_size=2)`` -> a dict per sample;
* single objects: ``IterableWrapper(sample keys).shuffle().sharding_filter()`` -> the fields of
  each sample opened with ``FSSpecFileOpener`` and read.

(The article's snippet ``.cycle()``s the URLs forever; here an epoch is one pass.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import _common, _sidevenv

TORCHDATA = "torchdata==0.9.0"


def ensure_venv(path: str | Path, *, python: str = sys.executable, log: Any = print) -> str:
    """Create (once) a venv with torchdata 0.9 layered over this environment; returns its python.

    Only torchdata itself is installed (``--no-deps``): torch, fsspec and s3fs come from the
    current environment, so the torch version is the same on both sides.
    """
    path = Path(path)
    exe = path / "bin" / "python"
    marker = path / ".pipeflow-datapipes-ok"
    if marker.exists() and exe.exists() and _sidevenv.layered_over_this_env(path):
        return str(exe)
    log(f"creating the DataPipes venv in {path} ({TORCHDATA}, layered over {sys.prefix})")
    subprocess.run([python, "-m", "venv", "--without-pip", "--clear", str(path)], check=True)
    site = subprocess.run([str(exe), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    _sidevenv.write_base_pth(site)
    subprocess.run([python, "-m", "pip", "--python", str(exe), "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", TORCHDATA], check=True)
    check = subprocess.run([str(exe), "-W", "ignore", "-c",
                            "import torchdata.datapipes.iter, torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"torchdata DataPipes do not import in {path}: {check.stderr[-500:]}")
    marker.write_text(check.stdout)
    return str(exe)


def _key(item: tuple[str, Any]) -> str:
    return os.path.basename(item[0]).split(".")[0]


def _to_sample(group: list[tuple[str, Any]], decode: bool) -> dict[str, Any]:
    sample = {name.rsplit(".", 1)[1]: stream.read() for name, stream in group}
    return _common.decode_224(sample) if decode else sample


def _read_sample(key_url: str, fields: tuple[str, ...], decode: bool) -> dict[str, Any]:
    from torchdata.datapipes.iter import FSSpecFileOpener, IterableWrapper

    urls = [f"{key_url}.{f}" for f in fields]
    opened = FSSpecFileOpener(IterableWrapper(urls), mode="rb", **_fs_kwargs())
    sample = {url.rsplit(".", 1)[1]: stream.read() for url, stream in opened}
    return _common.decode_sample(sample) if decode else sample


def _fs_kwargs() -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": _common.endpoint(), "region_name": _common.region()}}


def make_shards(shards: list[str], workers: int, batch_size: int = 4, decode: bool = False) -> Any:
    import functools

    from torchdata.datapipes.iter import FSSpecFileOpener, IterableWrapper

    urls = IterableWrapper(shards).shuffle().sharding_filter()
    tars = FSSpecFileOpener(urls, mode="rb", **_fs_kwargs()).load_from_tar()
    samples = tars.groupby(_key, group_size=2, guaranteed_group_size=2)
    dataset = samples.map(functools.partial(_to_sample, decode=decode)).shuffle(buffer_size=10)
    return _common.loader(dataset, workers=workers, batch_size=batch_size)


def make_single(prefix: str, count: int, fields: list[str], workers: int, batch_size: int = 4,
                decode: bool = False) -> Any:
    import functools

    from torchdata.datapipes.iter import IterableWrapper

    base = prefix.rstrip("/")
    keys = IterableWrapper([f"{base}/{i:06d}" for i in range(count)]).shuffle().sharding_filter()
    dataset = keys.map(functools.partial(_read_sample, fields=tuple(fields), decode=decode))
    return _common.loader(dataset, workers=workers, batch_size=batch_size)
