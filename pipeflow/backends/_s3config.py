"""S3 configuration shared by every S3 backend, and S3 error translation.

Resolution order, the same for every backend (so ``AWS_ENDPOINT_URL`` plus credentials in the
environment is enough for all of them, including tools such as s5cmd that ignore that variable):

* endpoint: the ``endpoint=`` option, else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``,
  else the SDK's default (real AWS);
* region: ``region=``, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else the profile's
  region (SDKs that read profiles), else ``us-east-1``;
* credentials: ``access_key=``/``secret_key=``/``session_token=`` options when given, else the
  SDK's own chain (environment, ``profile=``/``AWS_PROFILE``, shared files, instance roles);
* addressing: path-style (``http://host/bucket/key``) whenever a custom endpoint is in use,
  unless ``path_style=False``; virtual-hosted style on AWS.

Credentials never appear in a repr or an error message.
"""

from __future__ import annotations

import configparser
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..errors import (
    AccessDeniedError,
    BackendError,
    ConfigError,
    InvalidURLError,
    ObjectChangedError,
    ObjectNotFoundError,
    PipeflowError,
    RetryExhaustedError,
    install_line,
)
from ._optional import require
from ._retry import RetryPolicy, s3_error_code
from .base import BackendOptions, legacy_name_hint

__all__ = [
    "S3Options", "error_for_status", "is_invalid_range", "no_credentials_error", "resolve_endpoint",
    "resolve_region", "translate_s3_error",
]

DEFAULT_REGION = "us-east-1"
#: (connect, read) seconds: generous for a slow link, short enough that a stalled server is
#: noticed and retried within a minute
DEFAULT_TIMEOUT: tuple[float, float] = (10.0, 30.0)

NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchVersion"})
DENIED_CODES = frozenset({
    "AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    "AllAccessDisabled", "AccountProblem", "InvalidSecurity", "ExpiredToken", "InvalidToken",
    "TokenRefreshRequired", "UnauthorizedAccess",
})
INVALID_CODES = frozenset({"InvalidBucketName", "InvalidURI", "KeyTooLongError", "InvalidArgument"})


def resolve_endpoint(explicit: str | None = None) -> str | None:
    """The S3 endpoint URL to use, or None for the SDK default (AWS).

    Raises:
        ConfigError: the endpoint found has no ``http://`` or ``https://`` scheme. Checked here,
            where every backend reads it, because each SDK fails its own way on
            ``AWS_ENDPOINT_URL=127.0.0.1:9000``: botocore with a bare ``ValueError``, the CRT
            client as a request error, obstore with a Rust panic that is not an ``Exception``.
    """
    for source, value in (("endpoint=", explicit),
                          ("AWS_ENDPOINT_URL_S3", os.environ.get("AWS_ENDPOINT_URL_S3")),
                          ("AWS_ENDPOINT_URL", os.environ.get("AWS_ENDPOINT_URL"))):
        if value:
            return _checked_endpoint(source, value).rstrip("/")
    return None


def _checked_endpoint(source: str, value: str) -> str:
    if value[:8].lower().startswith(("http://", "https://")):
        return value
    hint = f" (did you mean 'http://{value}'?)" if "://" not in value else ""
    raise ConfigError(f"{source} must be an http:// or https:// URL, got {value!r}{hint}")


def on_s3_endpoint(url: str) -> str | None:
    """The ``s3://bucket/key`` an ``http(s)://`` URL on the configured S3 endpoint names
    (path-style: ``http://127.0.0.1:9000/bucket/key``), or None for any other URL.

    Pasting the endpoint into the data URL is a common first mistake: read over plain HTTP,
    the store answers an unsigned GET with 403 and a listing with a page that holds no links.
    A malformed ``AWS_ENDPOINT_URL`` counts as no endpoint here: this is only a hint for
    http(s) URLs, which do not use it; the S3 paths that do raise the :class:`ConfigError`.
    """
    if not url.lower().startswith(("http://", "https://")):
        return None
    try:
        endpoint = resolve_endpoint()
    except ConfigError:
        return None
    if not endpoint:
        return None
    if url[:len(endpoint)].lower() != endpoint.lower() or url[len(endpoint):len(endpoint) + 1] != "/":
        return None
    return "s3://" + url[len(endpoint) + 1:]


#: AWS's S3 hosts, virtual-hosted (``bucket.s3[.-]region.amazonaws.com``) or path-style
#: (``s3[.-]region.amazonaws.com/bucket``)
_AWS_S3_HOST = re.compile(r"(?:(?P<bucket>[^/]+)\.)?s3(?:[.-][a-z0-9-]+)?\.amazonaws\.com", re.I)


def on_aws_s3(url: str) -> str | None:
    """The ``s3://bucket/key`` an ``https://`` URL of an object or prefix on AWS S3 names, or
    None. Read over HTTPS such a URL works for a public object, but a listing cannot: S3
    answers with XML, not the links an HTTP listing looks for."""
    parts = urlsplit(url)
    match = _AWS_S3_HOST.fullmatch(parts.hostname or "") if parts.scheme in ("http", "https") else None
    if match is None:
        return None
    path = parts.path.lstrip("/")
    return "s3://" + (f"{match['bucket']}/{path}" if match["bucket"] else path)


def resolve_region(explicit: str | None = None) -> str:
    """The region to sign requests for (profile regions are left to SDKs that read profiles)."""
    for value in (explicit, os.environ.get("AWS_REGION"), os.environ.get("AWS_DEFAULT_REGION")):
        if value:
            return value
    return DEFAULT_REGION


@dataclass(frozen=True)
class S3Options(BackendOptions):
    """Options shared by the S3 backends.

    Attributes:
        endpoint: an S3-compatible endpoint URL (``http://127.0.0.1:9000``); defaults to
            ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, else AWS.
        region: signing region; defaults to ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` / us-east-1.
        profile: a named profile from the shared AWS config files.
        path_style: force path-style (True) or virtual-hosted (False) addressing; None picks
            path-style for custom endpoints.
        access_key, secret_key, session_token: explicit credentials (never shown in reprs);
            by default the SDK's credential chain is used.
        retry: the retry policy for transient failures (default: retry each request for up to
            60 s, see :class:`~pipeflow.backends._retry.RetryPolicy`; an int ``n`` means ``n``
            retries, a mapping gives the policy's fields). It is the only retry layer: every
            backend turns its SDK's own retries off (or down to the policy's budget where the
            SDK cannot be turned off), so giving up takes a bounded, predictable time.
        timeout: seconds to wait for a connection and for the next bytes of a response:
            ``(connect, read)``, or one number for both; None leaves the SDK's defaults
            (botocore: 60 s each). A request that exceeds it fails as a transient timeout and
            is retried under ``retry``, so a stalled server ends in
            :class:`~pipeflow.errors.RetryExhaustedError` once the retry budget is spent
            (plus at most one ``connect + read``) instead of hanging.
    """

    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    path_style: bool | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float | tuple[float, float] | None = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "timeout", _check_timeout(self.timeout))
        if self.endpoint is not None:
            if not isinstance(self.endpoint, str) or not self.endpoint:
                raise ConfigError(f"endpoint must be an http(s):// URL, got {self.endpoint!r}")
            _checked_endpoint("endpoint", self.endpoint)  # as AWS_ENDPOINT_URL: the scheme it lacks
        for name in ("region", "profile"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} must be a non-empty str, got {value!r}")
        if self.path_style is not None and not isinstance(self.path_style, bool):
            raise ConfigError(f"path_style must be True, False or None, got {self.path_style!r}")
        if (self.access_key is None) != (self.secret_key is None):
            raise ConfigError("access_key and secret_key must be given together")
        object.__setattr__(self, "retry", RetryPolicy.coerce(self.retry))

    # resolved per call (in the process that makes the client), so DataLoader workers and
    # subprocesses see the environment they run in
    def resolved_endpoint(self) -> str | None:
        return resolve_endpoint(self.endpoint)

    def resolved_region(self) -> str:
        return resolve_region(self.region)

    def endpoint_label(self) -> str:
        """The endpoint requests go to: the resolved URL, or AWS's regional endpoint. Named in
        error messages, and the key of the first-contact rule (:mod:`pipeflow.backends._retry`)."""
        return self.resolved_endpoint() or f"https://s3.{self.resolved_region()}.amazonaws.com"

    def endpoint_for(self, url: str) -> str | None:
        """:meth:`endpoint_label` for an ``s3://`` URL, None for any other (for error messages)."""
        return self.endpoint_label() if url[:5].lower() == "s3://" else None

    def use_path_style(self) -> bool:
        if self.path_style is not None:
            return self.path_style
        return self.resolved_endpoint() is not None

    @property
    def connect_timeout(self) -> float | None:
        """Seconds allowed to establish a connection (None: the SDK's default)."""
        return None if self.timeout is None else self.timeout[0]  # type: ignore[index]

    @property
    def read_timeout(self) -> float | None:
        """Seconds allowed between bytes of a response (None: the SDK's default)."""
        return None if self.timeout is None else self.timeout[1]  # type: ignore[index]

    def botocore_config_kwargs(self) -> dict[str, Any]:
        """``botocore.config.Config`` arguments for addressing, timeouts and no SDK retries."""
        kwargs: dict[str, Any] = {
            # pipeflow's RetryPolicy is the only retry layer (one attempt per SDK call)
            # (botocore's "max_attempts" counts retries after the first try; "total_max_attempts"
            # counts tries)
            "retries": {"total_max_attempts": 1, "mode": "standard"},
        }
        if self.use_path_style():
            kwargs["s3"] = {"addressing_style": "path"}
        if self.timeout is not None:
            kwargs["connect_timeout"] = self.connect_timeout
            kwargs["read_timeout"] = self.read_timeout
        return kwargs

    def boto3_client(self, **config: Any) -> Any:
        """A botocore S3 client configured from these options (imports boto3)."""
        boto3 = require("boto3", extra="boto3")
        Config = require("botocore.config", extra="boto3").Config

        cfg = Config(**{**self.botocore_config_kwargs(), **config})
        try:
            session = boto3.session.Session(profile_name=self.profile, botocore_session=_botocore_session())
            return session.client(
                "s3", endpoint_url=self.resolved_endpoint(), region_name=self.resolved_region(),
                aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
                aws_session_token=self.session_token, config=cfg)
        except require("botocore.exceptions", extra="boto3").ProfileNotFound as exc:
            # raised here, before any request and outside the translated calls: a bare botocore
            # exception otherwise (profile=, or AWS_PROFILE, naming no profile of the files)
            raise no_profile_error(exc.kwargs.get("profile")) from exc

    def check_profile(self) -> None:
        """Raise :func:`no_profile_error` when ``profile=`` (or ``AWS_PROFILE``) names no profile
        of the shared files, for a client that would otherwise find out at its first request
        (the CRT's: as a refused or unreachable endpoint, or after its retries)."""
        name = self.profile or os.environ.get("AWS_PROFILE")
        if name and name not in profile_names():
            raise no_profile_error(name)


def no_profile_error(name: object) -> ConfigError:
    """The error for ``profile=`` (or ``AWS_PROFILE``) naming no profile, every backend alike."""
    return ConfigError(f"no AWS profile named {name!r} in the shared config files (~/.aws/config, "
                       "~/.aws/credentials, or AWS_CONFIG_FILE and AWS_SHARED_CREDENTIALS_FILE); "
                       "check profile= and AWS_PROFILE")


def profile_names() -> set[str]:
    """The profiles the shared files define (``[profile NAME]`` or ``[default]`` in the config
    file, ``[NAME]`` in the credentials file), as botocore reads them; unreadable files define none."""
    names: set[str] = set()
    for variable, default in (("AWS_CONFIG_FILE", "~/.aws/config"),
                              ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")):
        parser = configparser.RawConfigParser(strict=False, interpolation=None)
        try:
            parser.read(os.path.expanduser(os.environ.get(variable) or default))
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in parser.sections():
            name = section.strip()
            if variable == "AWS_CONFIG_FILE" and name.startswith("profile "):
                name = name[len("profile "):].strip()
            names.add(name)
    return names


#: botocore's data loaders by search path, shared by every client of the process: a loader parses
#: S3's service description (JSON of several MB) once and keeps it, so the second client of a
#: process, and every client of a DataLoader worker forked after the first, skip that parse
#: (about 0.3 s of CPU per client on a quiet core: per-worker start-up that a map-style dataset
#: holding one client made before the fork never pays). A loader holds parsed data only: no
#: connection, no thread, so a forked child may keep using it.
_LOADERS: dict[str | None, Any] = {}


def _botocore_session() -> Any:
    """A fresh botocore session (credentials and configuration are per session, as before)
    whose data loader is the process's shared one."""
    session_mod = require("botocore.session", extra="boto3")
    loaders = require("botocore.loaders", extra="boto3")
    session = session_mod.get_session()
    path = session.get_config_variable("data_path")
    loader = _LOADERS.get(path)
    if loader is None:
        loader = _LOADERS.setdefault(path, loaders.create_loader(path))
    session.register_component("data_loader", loader)
    return session


def _check_timeout(value: Any) -> tuple[float, float] | None:
    """Normalise ``timeout`` to ``(connect, read)`` seconds (or None)."""
    if value is None:
        return None
    pair = (value, value) if isinstance(value, (int, float)) else value
    if isinstance(pair, list):
        pair = tuple(pair)
    if (not isinstance(pair, tuple) or len(pair) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in pair)):
        raise ConfigError(f"timeout must be a positive number of seconds, a (connect, read) pair of "
                          f"them, or None, got {value!r}")
    return float(pair[0]), float(pair[1])


def error_for_status(status: int | None, code: str, *, url: str, backend: str, op: str,
                     what: str = "") -> BackendError:
    """A typed error for an HTTP status / S3 error code (used by every S3 backend)."""
    code = code or (str(status) if status else "")
    detail = f"{what or 'request failed'}: {code}" if code else (what or "request failed")
    if code in NOT_FOUND_CODES or status == 404:
        return ObjectNotFoundError(_not_found(code or "404", url), url=url, backend=backend, op=op)
    if code in DENIED_CODES or status == 403:
        return AccessDeniedError(f"access denied ({code or 403})", url=url, backend=backend, op=op)
    if code == "PreconditionFailed" or status == 412:  # If-Match: the object was replaced
        return ObjectChangedError("the object changed while it was read (its ETag no longer "
                                  "matches): read it again", url=url, backend=backend, op=op)
    if code in INVALID_CODES:
        return InvalidURLError(f"invalid bucket or key ({code})", url=url, backend=backend, op=op)
    return BackendError(detail, url=url, backend=backend, op=op)


def _not_found(code: str, url: str) -> str:
    """What a "not found" says: which is missing, the bucket or the key, where the store's code
    tells (a GET's ``NoSuchBucket``, ``NoSuchKey``); "object or bucket" where it does not (a
    HEAD's bare 404)."""
    bucket, _, key = url.split("://", 1)[1].partition("/") if "://" in url else ("", "", "")
    if url.lower().startswith("s3://") and bucket:
        if code == "NoSuchBucket":
            return f"no such bucket {bucket!r}{legacy_name_hint(url)}"
        if code == "NoSuchKey" and key:
            return f"no such key {key!r} in bucket {bucket!r}"
    return f"no such object or bucket ({code}){legacy_name_hint(url)}"


def no_credentials_error(*, url: str, backend: str, op: str,
                         boto3_missing: bool = False) -> AccessDeniedError:
    """The error for "no credentials anywhere", with how to give them: the first thing a new
    user meets on a machine without AWS configuration, so it says what to set."""
    how = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or pass access_key= and secret_key= to open()"
    if boto3_missing:
        how += f"; a profile or ~/.aws/credentials is read through boto3: {install_line('boto3')}"
    else:
        how += ", or name a profile of ~/.aws/credentials (AWS_PROFILE or profile=)"
    return AccessDeniedError(f"no usable credentials found: {how}", url=url, backend=backend, op=op)


def translate_s3_error(exc: BaseException, *, url: str, backend: str, op: str) -> BaseException:
    """Map an SDK exception to a pipeflow error by error code or type (never by message).

    Pipeflow errors and exceptions that are not the SDK's are returned unchanged.
    """
    if isinstance(exc, PipeflowError):
        return exc
    found = s3_error_code(exc)
    if found is not None:
        code, status = found
        return error_for_status(status, code, url=url, backend=backend, op=op)
    bexc = sys.modules.get("botocore.exceptions")
    if bexc is not None:
        if isinstance(exc, (bexc.NoCredentialsError, bexc.PartialCredentialsError)):
            return no_credentials_error(url=url, backend=backend, op=op)
        if isinstance(exc, bexc.ProfileNotFound):
            return no_profile_error(exc.kwargs.get("profile"))
        if isinstance(exc, bexc.BotoCoreError):
            return BackendError(f"{type(exc).__name__}", url=url, backend=backend, op=op)
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientResponseError):  # fsspec's http://
        return error_for_status(exc.status, "", url=url, backend=backend, op=op)
    stx = sys.modules.get("s3transfer.exceptions")
    if stx is not None and isinstance(exc, stx.RetriesExceededError):
        # boto3's managed transfers (download_fileobj, iopath) retry downloads on their own
        return RetryExhaustedError(f"the transfer gave up after its retries: "
                                   f"{type(exc.last_exception).__name__}", url=url, backend=backend, op=op)
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFoundError("no such object", url=url, backend=backend, op=op)
    if isinstance(exc, PermissionError):
        return AccessDeniedError("access denied", url=url, backend=backend, op=op)
    return exc


def is_invalid_range(exc: BaseException | None) -> bool:
    """True when ``exc`` (or its cause) is S3's 416 answer to a range starting past the end."""
    code, status = s3_error_code(exc) or ("", None)
    return code == "InvalidRange" or status == 416
