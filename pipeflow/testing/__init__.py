"""Test helpers that ship with pipeflow: a local S3-compatible server (and data generators).

Importing this package starts nothing and imports no SDK; :func:`local_s3` starts the server.
"""

from __future__ import annotations

from .s3server import LocalS3, free_port, local_s3

__all__ = ["LocalS3", "free_port", "local_s3"]
