"""The ``s5cmd`` backend: the s5cmd binary (Go) for listing, streaming and batched downloads.

* ``list`` runs ``s5cmd --json ls 's3://bucket/prefix*'`` and sorts the result by URL;
* ``open`` asks for the object's size (``s5cmd head``, one extra HEAD request), then streams
  ``s5cmd cat --raw URL`` from the child's stdout; closing the stream kills and reaps the
  process, and reading to the end checks its exit status *and* the byte count;
* ``info`` runs ``s5cmd --json head --raw URL``;
* :meth:`S5cmdBackend.start_batch` downloads many objects with one ``s5cmd run`` command file,
  the way the "s5cmd sampler" of the seed article does; ``fetch_batch()`` uses it.

s5cmd ignores ``AWS_ENDPOINT_URL``: the endpoint resolved by :mod:`pipeflow.backends._s3config`
is passed explicitly with ``--endpoint-url``. Explicit credentials go to the child through its
environment, never its argv (which ``ps`` shows to every user). s5cmd picks path-style
addressing by itself for any non-AWS endpoint, so ``path_style`` has no effect here.

Retries: single calls (``ls``, ``head``, ``cat``) run with s5cmd's own retries off
(``--retry-count 0``); their transient failures, recognised by S3 error code and HTTP status
or the SDK's ``RequestError`` code, are retried under the backend's
:class:`~pipeflow.backends._retry.RetryPolicy`, the same time budget as every other backend.
When a connection is reset in the middle of a body, ``s5cmd cat`` can end its output early
*with exit status 0*, so the stream is a :class:`~pipeflow.backends._resumable.ResumableStream`
that knows the size: a short body is resumed from the byte already delivered. ``s5cmd cat``
cannot read a byte range, so a resumption starts a new ``s5cmd cat`` and reads and discards the
bytes already delivered (costly for large objects; the other S3 backends use a ranged GET).
Batched ``run`` downloads run with s5cmd's retries off too: the files that failed transiently
(by the same codes, or a connection broken mid-body, which s5cmd reports as Go's own
``unexpected EOF`` or ``connection reset by peer``) are downloaded again by another
``s5cmd run``, after the policy's backoff, until the budget's deadline (a round that downloads
anything ends the outage); see ``_batch``.

Timeouts: s5cmd has no connect or read timeout flags. ``timeout`` (connect, read) is enforced
from the outside instead: a ``cat`` that sends no byte for ``connect + read`` seconds is killed
and resumed like a broken body (a transient :class:`TimeoutError`), and one ``head`` call may
take at most ``connect + read`` seconds before it is retried. ``ls`` and batched ``run``
downloads are bounded only by ``call_timeout`` / ``S5cmdBatch.wait(timeout)``.

One module per concern: ``_binary`` (finding the executable), ``_options``, ``_command``
(argv, environment, command-file quoting), ``_errors`` (translation by code), ``_cat``
(streaming with a stall bound), ``_batch`` (``s5cmd run``), ``_backend`` (the class).
"""

from __future__ import annotations

from ._backend import S5cmdBackend
from ._batch import S5cmdBatch
from ._binary import find_s5cmd
from ._command import quote_run_arg
from ._errors import S5cmdTransientError, classify_error
from ._options import S5cmdOptions

__all__ = [
    "S5cmdBackend",
    "S5cmdBatch",
    "S5cmdOptions",
    "S5cmdTransientError",
    "classify_error",
    "find_s5cmd",
    "quote_run_arg",
]
