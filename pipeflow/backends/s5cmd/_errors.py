"""Translating s5cmd's error records into pipeflow errors, by S3 error code and HTTP status.

s5cmd reports failures as JSON lines (``--json``) whose ``error`` field is either an S3 error
(``"NoSuchKey: ... status code: 404, ..."``), a request-level error of the AWS SDK for Go
(``"RequestError: send request failed ..."``: connection refused or reset), or one of s5cmd's own
messages (``"given object ... not found"``, ``"no object found"``) that carry no code at all.
Missing credentials are the SDK's ``NoCredentialProviders`` code, with no status (nothing was sent).
A connection broken while a body is read reaches the record as Go's own network error, with no
code either (``"unexpected EOF"``, ``"read tcp ...: read: connection reset by peer"``). These
two kinds, and only these, are recognised by their text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...errors import AccessDeniedError, BackendError, ObjectNotFoundError, RetryExhaustedError
from .._retry import is_transient_status
from .._s3config import error_for_status, no_credentials_error

__all__ = ["S5cmdTransientError", "answered_in", "classify_error", "error_from_output", "errors_in",
           "transient_in"]

_S3_ERROR = re.compile(r"^\s*(?P<code>[A-Za-z][A-Za-z0-9.]*):.*?status code: (?P<status>\d{3})", re.S)
#: request-level error codes of the AWS SDK for Go (no HTTP status: the request got no answer)
_SDK_ERROR = re.compile(r"^\s*(?P<code>RequestError|ResponseTimeout):", re.S)
#: a connection broken mid-body, in Go's words (io.ErrUnexpectedEOF, io.EOF, the errno texts):
#: transient like the SDK's RequestError, under the code ``BrokenConnection``
_BROKEN = re.compile(r"(?:^|: )(?:unexpected EOF|EOF|connection reset by peer|broken pipe"
                     r"|use of closed network connection|i/o timeout)\s*$", re.S)
_S5CMD_NOT_FOUND = re.compile(r"^(given object .* not found|no object found)$", re.S)
#: the AWS SDK for Go's code for "no credentials in any provider of the chain" (no HTTP status:
#: no request was sent)
_NO_CREDENTIALS = re.compile(r"^\s*NoCredentialProviders:", re.S)
#: its code for a profile's shared credentials file that cannot be read (no such file or profile)
_SHARED_CREDENTIALS = re.compile(r"^\s*SharedCredsLoad:", re.S)


class S5cmdTransientError(ConnectionError):
    """s5cmd reported a transient failure (5xx, 429, throttling, no connection).

    Raised for single calls (``ls``, ``head``, ``cat``), which s5cmd does not retry itself:
    pipeflow's :class:`~pipeflow.backends._retry.RetryPolicy` retries them, and raises
    :class:`~pipeflow.errors.RetryExhaustedError` when its budget is spent.
    """

    def __init__(self, code: str, status: int | None, text: str) -> None:
        self.code = code
        self.status = status
        self.text = text
        super().__init__(f"s5cmd: {code}" + (f" (HTTP {status})" if status else "") + f": {text[-300:]}")

    def __reduce__(self):  # pickles with its fields
        return (type(self), (self.code, self.status, self.text))


def transient_in(text: str) -> S5cmdTransientError | None:
    """The transient failure ``text`` (an ``error`` field) reports, by code, or None."""
    text = text.strip()
    match = _S3_ERROR.match(text)
    if match:
        code, status = match["code"], int(match["status"])
        return S5cmdTransientError(code, status, text) if is_transient_status(code, status) else None
    match = _SDK_ERROR.match(text)
    if match:
        return S5cmdTransientError(match["code"], None, text)
    if _BROKEN.search(text):
        return S5cmdTransientError("BrokenConnection", None, text)
    return None


def answered_in(text: str) -> bool:
    """Whether an ``error`` field reports an answer of the store (an S3 error with its HTTP
    status), not a request that got none (the first-contact rule, :mod:`pipeflow.backends._retry`)."""
    return _S3_ERROR.match(text.strip()) is not None


def classify_error(error: str, *, url: str, op: str, status: int | None = None) -> BackendError:
    """A typed, final error for one s5cmd error message (a transient one: s5cmd gave up)."""
    text = error.strip()
    transient = transient_in(text)
    if transient is not None:
        http = f" (HTTP {transient.status})" if transient.status else ""
        return RetryExhaustedError(f"s5cmd gave up after its retries: {transient.code}{http}",
                                   url=url, backend="s5cmd", op=op)
    match = _S3_ERROR.match(text)
    if match:
        return error_for_status(int(match["status"]), match["code"], url=url, backend="s5cmd", op=op,
                                what="s5cmd")
    if _S5CMD_NOT_FOUND.match(text):
        return ObjectNotFoundError("no such object or prefix", url=url, backend="s5cmd", op=op)
    if _NO_CREDENTIALS.match(text):
        return no_credentials_error(url=url, backend="s5cmd", op=op)
    if _SHARED_CREDENTIALS.match(text):
        return AccessDeniedError(f"cannot load the profile's shared credentials (check profile= and "
                                 f"AWS_PROFILE): {text[-300:]}", url=url, backend="s5cmd", op=op)
    suffix = f" (exit status {status})" if status is not None else ""
    return BackendError(f"s5cmd failed{suffix}: {text[-500:] or 'no error message'}",
                        url=url, backend="s5cmd", op=op)


def errors_in(text: str) -> list[dict[str, Any]]:
    """The JSON error records in s5cmd's stderr (other lines are ignored)."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "error" in record:
                records.append(record)
    return records


def error_from_output(status: int, stderr: str, *, url: str, op: str,
                      silent_is_transient: bool = False) -> BaseException:
    """The error for a failed single call: transient (to be retried) or typed and final.

    ``silent_is_transient``: a failure with no error record at all counts as transient. That is
    how ``s5cmd cat`` reports a failed GET; ``open`` sends it only after ``head`` has already
    translated the permanent errors (missing object, access denied) by their codes.
    """
    records = errors_in(stderr)
    text = str(records[-1]["error"]) if records else stderr
    if silent_is_transient and not text.strip():
        return S5cmdTransientError("NoErrorRecord", None, f"s5cmd exited with status {status}")
    transient = transient_in(text)
    if transient is not None:
        return transient
    return classify_error(text, url=url, op=op, status=status)
