"""Side virtual environments for peers whose pins clash with the main one, or that the main
environment does not carry (LitData and Mosaic in one; SPDL in another).

A side venv sees every package of the main environment through a ``.pth`` file (so torch, boto3,
numpy and PIL are the very same builds on both sides) and gets only the peers' own packages,
installed with ``--no-deps`` so their pins cannot pull another torch or numpy. Packages listed in
a spec's ``with_deps`` are installed with their dependencies under the repository's constraints
file. Each venv is described by one frozen :class:`SideVenv` and built once; a marker file holds
the package list it was built with, so a changed list rebuilds it.

What differs from each library's declared requirements, and why:

* ``mosaicml-streaming`` 0.13 pins ``numpy<2.2``; it runs here on the main environment's numpy
  2.x (its MDS reader and writer use only long-stable numpy calls).
* Both LitData and Mosaic declare ``torchvision``. The only torchvision wheel for this torch is a
  CUDA build (its ``_C.so`` links ``libtorch_cuda.so``), which cannot load on the CPU torch, so
  none is installed: LitData imports torchvision only to (de)serialize images and tensors as
  images, which these benchmarks do not use (the JPEG bytes are stored as bytes and decoded with
  PIL by the benchmark, as for every other library); Mosaic imports it at package import for its
  ``streaming.vision`` dataset classes, so the Mosaic peer registers placeholder modules for
  the two names that import needs (:func:`benchmarks.peers.mosaic.without_torchvision`).
* Mosaic's cloud SDKs (GCS, OCI, Azure, paramiko) are not installed: only its S3 path runs.
* SPDL (``spdl`` = ``spdl_core`` + ``spdl_io``) declares only numpy, which the main environment
  has. Its decoder (``spdl.io``) needs the system's FFmpeg libraries (Debian: ``apt-get install
  libavutil57 libavcodec59 libavformat59 libavfilter8 libswscale6 libswresample4
  libavdevice59``); each run asks whether they load (:func:`benchmarks.peers.spdl_peer.probe`)
  and marks only the rows that decode with FFmpeg unavailable when they do not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SideVenv:
    """One side venv: what it is called, where it lives, what goes in and how it is checked.

    ``check`` is Python run by the venv's interpreter (with the repository on the path); it must
    exit 0, and what it prints is kept in the marker file (:func:`check_output` reads it back).
    """

    what: str  # for log lines and notes: "LitData / Mosaic"
    dirname: str  # under ~/.cache/pipeflow/
    path_variable: str  # an environment variable that moves it
    no_deps: tuple[str, ...]
    check: str
    with_deps: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.no_deps or not self.check.strip():
            raise ValueError(f"side venv {self.what!r}: no_deps and check must not be empty")
        if any(not p.strip() for p in self.no_deps + self.with_deps):
            raise ValueError(f"side venv {self.what!r}: empty package requirement")

    @property
    def wanted(self) -> str:
        """The package list, as the marker file starts (a different list rebuilds the venv)."""
        return "\n".join(self.no_deps + self.with_deps)


STREAMING = SideVenv(
    what="LitData / Mosaic",
    dirname="streaming-peers-venv",
    path_variable="PIPEFLOW_BENCH_PEERS_VENV",
    no_deps=("litdata==0.2.76", "lightning-utilities", "tifffile", "obstore",
             "mosaicml-streaming==0.13.0", "xxhash<4", "zstd", "python-snappy", "cramjam", "brotli",
             "catalogue"),
    #: Mosaic's StreamingDataLoader imports ``transformers`` at package import
    with_deps=("transformers<5",),
    check=("import litdata, obstore, benchmarks.peers.mosaic as m; m.import_streaming(); "
           "print(litdata.__version__)"),
)
#: backwards-compatible names of the LitData / Mosaic venv's package lists
NO_DEPS, WITH_DEPS, CHECK = STREAMING.no_deps, STREAMING.with_deps, STREAMING.check

SPDL = SideVenv(
    what="SPDL",
    dirname="spdl-venv",
    path_variable="PIPEFLOW_BENCH_SPDL_VENV",
    no_deps=("spdl==0.8.0", "spdl_core==0.8.0", "spdl_io==0.8.0"),
    check="from importlib.metadata import version; import spdl.pipeline; print(version('spdl'))",
)


def default_path(spec: SideVenv = STREAMING) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(os.environ.get(spec.path_variable, Path(base) / "pipeflow" / spec.dirname))


def _marker(path: Path) -> Path:
    return path / ".pipeflow-peers-ok"


def base_pth_line() -> str:
    """The ``.pth`` line that layers a side venv over this environment's packages."""
    return f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"


def layered_over_this_env(path: Path) -> bool:
    """True if the side venv at ``path`` sees this environment's packages: one built over another
    environment (a clone's venv since removed, another checkout) would import none of them."""
    found = list(path.glob("lib/python*/site-packages/_pipeflow_base_env.pth"))
    return len(found) == 1 and found[0].read_text() == base_pth_line()


def write_base_pth(site: str) -> None:
    Path(site, "_pipeflow_base_env.pth").write_text(base_pth_line())


def ensure_venv(path: str | Path | None = None, *, spec: SideVenv = STREAMING,
                python: str = sys.executable, log: Any = print) -> str:
    """Create (once) the side venv of ``spec`` (default: LitData and Mosaic); returns its python."""
    path = Path(path or default_path(spec))
    exe = path / "bin" / "python"
    marker = _marker(path)
    if (marker.exists() and exe.exists() and marker.read_text().startswith(spec.wanted + "\n")
            and layered_over_this_env(path)):
        return str(exe)
    log(f"creating the {spec.what} venv in {path} (layered over {sys.prefix})")
    subprocess.run([python, "-m", "venv", "--without-pip", "--clear", str(path)], check=True)
    site = subprocess.run([str(exe), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    write_base_pth(site)
    pip = [python, "-m", "pip", "--python", str(exe), "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", *spec.no_deps], check=True)
    if spec.with_deps:
        env = dict(os.environ)
        if (ROOT / "constraints.txt").exists():
            env["PIP_CONSTRAINT"] = str(ROOT / "constraints.txt")
        subprocess.run([*pip, *spec.with_deps], check=True, env=env)
    check = subprocess.run([str(exe), "-W", "ignore", "-c", spec.check], capture_output=True, text=True,
                           cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
    if check.returncode != 0:
        raise RuntimeError(f"{spec.what} does not import in {path}: {check.stderr[-800:]}")
    marker.write_text(spec.wanted + "\n" + check.stdout.strip() + "\n")
    return str(exe)
