"""A side virtual environment for peers whose pins clash with the main one (LitData, Mosaic).

The venv sees every package of the main environment through a ``.pth`` file (so torch, boto3,
numpy and PIL are the very same builds on both sides) and gets only the peers' own packages,
installed with ``--no-deps`` so their pins cannot pull another torch or numpy. Packages listed in
``WITH_DEPS`` are installed with their dependencies under the repository's constraints file.

What differs from each library's declared requirements, and why:

* ``mosaicml-streaming`` 0.13 pins ``numpy<2.2``; it runs here on the main environment's numpy
  2.x (its MDS reader and writer use only long-stable numpy calls).
* Both libraries declare ``torchvision``. The only torchvision wheel for this torch is a CUDA
  build (its ``_C.so`` links ``libtorch_cuda.so``), which cannot load on the CPU torch, so none
  is installed: LitData imports torchvision only to (de)serialize images and tensors as images,
  which these benchmarks do not use (the JPEG bytes are stored as bytes and decoded with PIL by
  the benchmark, as for every other library); Mosaic imports it at package import for its
  ``streaming.vision`` dataset classes, so the Mosaic peer registers placeholder modules for
  the two names that import needs (:func:`benchmarks.peers.mosaic.without_torchvision`).
* Mosaic's cloud SDKs (GCS, OCI, Azure, paramiko) are not installed: only its S3 path runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NO_DEPS = (
    "litdata==0.2.76", "lightning-utilities", "tifffile", "obstore",
    "mosaicml-streaming==0.13.0", "xxhash<4", "zstd", "python-snappy", "cramjam", "brotli",
    "catalogue",
)
#: Mosaic's StreamingDataLoader imports ``transformers`` at package import
WITH_DEPS = ("transformers<5",)
CHECK = ("import litdata, obstore, benchmarks.peers.mosaic as m; m.import_streaming(); "
         "print(litdata.__version__)")


def default_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(os.environ.get("PIPEFLOW_BENCH_PEERS_VENV", Path(base) / "pipeflow" / "streaming-peers-venv"))


def ensure_venv(path: str | Path | None = None, *, python: str = sys.executable, log: Any = print) -> str:
    """Create (once) the side venv for LitData and Mosaic Streaming; returns its python."""
    path = Path(path or default_path())
    exe = path / "bin" / "python"
    marker = path / ".pipeflow-peers-ok"
    wanted = "\n".join(NO_DEPS + WITH_DEPS)
    if marker.exists() and exe.exists() and marker.read_text().startswith(wanted):
        return str(exe)
    log(f"creating the LitData / Mosaic venv in {path} (layered over {sys.prefix})")
    subprocess.run([python, "-m", "venv", "--without-pip", "--clear", str(path)], check=True)
    site = subprocess.run([str(exe), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    base = sysconfig.get_paths()["purelib"]
    Path(site, "_pipeflow_base_env.pth").write_text(f"import site; site.addsitedir({base!r})\n")
    pip = [python, "-m", "pip", "--python", str(exe), "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", *NO_DEPS], check=True)
    env = dict(os.environ)
    if (ROOT / "constraints.txt").exists():
        env["PIP_CONSTRAINT"] = str(ROOT / "constraints.txt")
    subprocess.run([*pip, *WITH_DEPS], check=True, env=env)
    check = subprocess.run([str(exe), "-W", "ignore", "-c", CHECK], capture_output=True, text=True,
                           cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
    if check.returncode != 0:
        raise RuntimeError(f"LitData / Mosaic do not import in {path}: {check.stderr[-800:]}")
    marker.write_text(wanted + "\n" + check.stdout)
    return str(exe)
