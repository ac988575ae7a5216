"""boto3 clients of one process share botocore's data loader: S3's service description is
parsed once per process (and not again in a child forked after it), credentials stay per client."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("boto3")

from pipeflow.backends._s3config import S3Options  # noqa: E402


def test_clients_share_one_loader_and_keep_their_own_credentials(monkeypatch):
    import botocore.loaders

    parses = []
    real = botocore.loaders.Loader.load_service_model

    def counting(self, service_name, type_name, api_version=None):
        parses.append((id(self), service_name, type_name))
        return real(self, service_name, type_name, api_version)

    monkeypatch.setattr(botocore.loaders.Loader, "load_service_model", counting)
    one = S3Options(endpoint="http://127.0.0.1:9", access_key="a1", secret_key="s1").boto3_client()
    two = S3Options(endpoint="http://127.0.0.1:9", access_key="a2", secret_key="s2").boto3_client()
    # one loader for both clients (its cache answers the second: same loader id every time)
    assert len({loader for loader, _, _ in parses}) == 1, parses
    assert one.meta.service_model.service_name == two.meta.service_model.service_name == "s3"
    assert one._request_signer._credentials.access_key == "a1"
    assert two._request_signer._credentials.access_key == "a2"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_reuses_the_parents_parsed_service_description():
    from pipeflow.backends import _s3config

    S3Options(endpoint="http://127.0.0.1:9", access_key="a", secret_key="s").boto3_client()
    loaders = list(_s3config._LOADERS.values())
    assert loaders
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = False
        try:
            import botocore.loaders

            real = botocore.loaders.Loader.load_data_with_path

            def refuse(self, name, *args, **kwargs):
                # small files (endpoints, partitions) are read again; the service model is not
                if "service-2" in name:
                    raise AssertionError("S3's service description parsed again")
                return real(self, name, *args, **kwargs)

            botocore.loaders.Loader.load_data_with_path = refuse
            S3Options(endpoint="http://127.0.0.1:9", access_key="b", secret_key="t").boto3_client()
            ok = True
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"
