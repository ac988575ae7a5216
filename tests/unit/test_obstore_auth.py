"""Where the obstore backend looks for credentials when boto3 is not there to read profiles:
object_store's own sources, and the instance-metadata service asked once, briefly."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from pipeflow.backends import _obstore_auth
from pipeflow.backends._s3config import S3Options
from pipeflow.errors import AccessDeniedError


class _Metadata(http.server.BaseHTTPRequestHandler):
    """IMDSv2's token endpoint: a PUT answered with a token; anything else refused."""

    def do_PUT(self) -> None:
        ok = self.path == "/latest/api/token" and "X-aws-ec2-metadata-token-ttl-seconds" in self.headers
        self.send_response(200 if ok else 403)
        self.end_headers()
        self.wfile.write(b"token" if ok else b"")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def no_boto3_no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_obstore_auth, "installed", lambda package: package != "boto3")
    for name in (*_obstore_auth._OWN_SOURCES, "AWS_SKIP_SIGNATURE", "AWS_EC2_METADATA_DISABLED",
                 "AWS_IMDSV1_FALLBACK", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


def test_an_answering_metadata_service_is_left_to_object_store(no_boto3_no_keys, metadata_server,
                                                               monkeypatch):
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", metadata_server)
    assert _obstore_auth.credential_provider(S3Options(), "b") is None
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # said to be absent: not asked
    with pytest.raises(AccessDeniedError, match="set AWS_ACCESS_KEY_ID"):
        _obstore_auth.credential_provider(S3Options(), "b")


@pytest.mark.parametrize("source", ["AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE",
                                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_SKIP_SIGNATURE"])
def test_object_stores_own_sources_are_left_to_it(no_boto3_no_keys, monkeypatch, source):
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")  # refused: not the reason
    monkeypatch.setenv(source, "true")
    assert _obstore_auth.credential_provider(S3Options(), "b") is None


def test_nothing_anywhere_is_access_denied_naming_how_to_give_credentials(no_boto3_no_keys, monkeypatch):
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
    with pytest.raises(AccessDeniedError) as info:
        _obstore_auth.credential_provider(S3Options(), "b")
    assert info.value.backend == "obstore" and info.value.url == "s3://b/"
    assert "AWS_SECRET_ACCESS_KEY" in str(info.value) and "pipeflow-data[boto3]" in str(info.value)
