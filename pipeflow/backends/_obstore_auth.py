"""Where the obstore backend's credentials come from, decided before its first request.

object_store alone reads keys from the environment, a web-identity token, a container's
credentials endpoint and instance metadata; it never reads ``~/.aws/credentials`` or a profile.
With boto3 installed, boto3's chain (profiles, shared files, SSO, roles) fills that gap. Without
boto3 and with none of object_store's own sources present, every request used to fail as
object_store's generic error (its instance-metadata call was refused), which is retried: the
user waited out the whole retry budget (60 s) for an opaque ``RetryExhaustedError``. Here that
case is an :class:`~pipeflow.errors.AccessDeniedError` before any request, saying how to give
credentials; instance metadata is asked once, with a short timeout, as botocore does.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any

from ._optional import installed, require
from ._s3config import S3Options, no_credentials_error, translate_s3_error

__all__ = ["credential_provider"]

#: environment variables that give object_store credentials (or tell it to need none) by itself
_OWN_SOURCES = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI")
#: seconds to wait for the instance-metadata service (botocore waits 1 s, once)
_METADATA_TIMEOUT = 1.0


def credential_provider(opts: S3Options, bucket: str) -> Any:
    """A credential provider over boto3's chain, or None to let object_store find credentials
    itself; :class:`~pipeflow.errors.AccessDeniedError` when there are none anywhere."""
    url = f"s3://{bucket}/"
    if opts.profile is None and not installed("boto3"):
        if _own_sources() or _metadata_answers():
            return None
        raise no_credentials_error(url=url, backend="obstore", op="credentials", boto3_missing=True)
    if opts.profile is None and os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    boto3 = require("boto3", extra="boto3")
    from obstore.auth.boto3 import Boto3CredentialProvider

    try:
        session = boto3.session.Session(profile_name=opts.profile)
        found = session.get_credentials()
    except Exception as exc:
        raise translate_s3_error(exc, url=url, backend="obstore", op="credentials") from exc
    if found is None:
        raise no_credentials_error(url=url, backend="obstore", op="credentials")
    return Boto3CredentialProvider(session)


def _own_sources() -> bool:
    if any(os.environ.get(name) for name in _OWN_SOURCES):
        return True
    return _true(os.environ.get("AWS_SKIP_SIGNATURE"))  # unsigned requests (public buckets)


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _metadata_answers() -> bool:
    """Whether the instance-metadata service answers here (object_store's last source): its
    IMDSv2 token request, or with ``AWS_IMDSV1_FALLBACK`` the role listing of IMDSv1."""
    if _true(os.environ.get("AWS_EC2_METADATA_DISABLED")):
        return False
    base = os.environ.get("AWS_METADATA_ENDPOINT", "http://169.254.169.254").rstrip("/")
    probes = [urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})]
    if _true(os.environ.get("AWS_IMDSV1_FALLBACK")):
        probes.append(urllib.request.Request(f"{base}/latest/meta-data/iam/security-credentials/"))
    return any(_answers(probe) for probe in probes)


def _answers(request: urllib.request.Request) -> bool:
    # the proxy settings of the environment must not route a link-local address
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=_METADATA_TIMEOUT) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False
