"""The backend registry: names, URL schemes, lazy imports, install hints, options."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys

import pytest

from pipeflow.backends import (
    Backend,
    backend_for_url,
    get_backend,
    known_backends,
    register_backend,
    unregister_backend,
)
from pipeflow.backends._s3config import S3Options, error_for_status, resolve_endpoint
from pipeflow.backends.base import parse_s3_url, scheme_of
from pipeflow.backends.local import LocalBackend
from pipeflow.errors import (
    AccessDeniedError,
    ConfigError,
    InvalidURLError,
    MissingDependencyError,
    ObjectNotFoundError,
    UnknownBackendError,
)

ALL = ["boto3", "fsspec", "iopath", "local", "obstore", "pipe", "s3fs", "s3torchconnector", "s5cmd"]


def test_builtin_backends_are_registered() -> None:
    assert set(ALL) <= set(known_backends())
    assert known_backends() == sorted(known_backends())


def test_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(UnknownBackendError) as info:
        get_backend("nosuch")
    assert isinstance(info.value, ValueError)
    for name in ALL:
        assert name in str(info.value)
    assert "did you mean" not in str(info.value)


def test_a_mistyped_backend_name_gets_the_close_one() -> None:
    with pytest.raises(UnknownBackendError, match="unknown backend 'bot03' \\(did you mean 'boto3'\\?\\)"):
        get_backend("bot03")


@pytest.mark.parametrize(("url", "expected"), [
    ("s3://bucket/key", "boto3"), ("S3://bucket/key", "boto3"), ("/data/x.tar", "local"),
    ("relative/x.tar", "local"), ("file:///data/x.tar", "local"), ("gs://bucket/x", "fsspec"),
    ("memory://x", "fsspec"),
])
def test_default_backend_by_scheme(url: str, expected: str) -> None:
    assert backend_for_url(url) == expected


def test_scheme_parsing() -> None:
    assert scheme_of("C:\\data\\x") == ""
    assert scheme_of("s3a://b/k") == "s3a"
    assert parse_s3_url("s3://bkt/some key/ü").key == "some key/ü"
    with pytest.raises(InvalidURLError):
        parse_s3_url("s3:///key")
    with pytest.raises(InvalidURLError):
        parse_s3_url("/local/path")


@pytest.mark.parametrize("url", ["s3://ab/x", "s3://192.168.0.1/k", "s3://a..b/k", "s3://-bucket/k",
                                 "s3://my*bucket/k", "s3://" + "a" * 256 + "/k"])
def test_an_invalid_bucket_name_is_refused_before_any_request(url) -> None:
    """A store answers "no such bucket" for a name it could never hold: the user then looks
    for a bucket instead of at the name."""
    with pytest.raises(InvalidURLError, match="invalid bucket name") as info:
        parse_s3_url(url)
    assert info.value.url == url
    with pytest.raises(InvalidURLError, match="invalid bucket name"):
        get_backend("fsspec").info(url.replace("s3://", "s3a://") + "/k")


@pytest.mark.parametrize("bucket", ["My_Bucket", "my_bucket", "Data", "a" * 64])
def test_a_legacy_bucket_name_is_read_and_named_when_not_found(bucket) -> None:
    """Buckets made under the pre-2018 us-east-1 rules still exist and path-style requests
    reach them: reading one is allowed; a "not found" for one names the likely typo."""
    from pipeflow.errors import ObjectNotFoundError
    from pipeflow.testing.datagen import generate

    assert parse_s3_url(f"s3://{bucket}/k").bucket == bucket
    with pytest.raises(InvalidURLError, match="invalid bucket name"):  # never for new data
        generate("jpeg", f"s3://{bucket}/x", count=1, image_size=8)
    err = error_for_status(404, "NoSuchBucket", url=f"s3://{bucket}/k", backend="boto3", op="get")
    assert isinstance(err, ObjectNotFoundError) and "not a valid bucket name" in str(err)
    fine = error_for_status(404, "NoSuchBucket", url="s3://my-bucket/k", backend="boto3", op="get")
    assert "not a valid bucket name" not in str(fine)


def test_import_pipeflow_imports_no_sdk() -> None:
    code = ("import sys, pipeflow, pipeflow.backends, pipeflow.testing; "
            "import pipeflow.stages.open, pipeflow.stages.listing; "
            "bad = [m for m in ('boto3', 'botocore', 's3fs', 'fsspec', 'iopath', 's3torchconnector', "
            "'obstore', 'aiobotocore', 'moto') if m in sys.modules]; print(bad); assert not bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_missing_sdk_gives_the_pip_line() -> None:
    register_backend("fake-sdk", "pipeflow_tests_fake_backend_module:Thing",
                     package="pipeflow_tests_fake_backend_module", extra="fake")
    try:
        with pytest.raises(MissingDependencyError) as info:
            get_backend("fake-sdk")
    finally:
        unregister_backend("fake-sdk")
    assert isinstance(info.value, ImportError)
    assert "pip install 'pipeflow-data[fake]'" in str(info.value)


def test_register_a_third_party_backend() -> None:
    register_backend("mylocal", "pipeflow.backends.local:LocalBackend", schemes=("mine",), replace=True)
    try:
        assert isinstance(get_backend("mylocal"), LocalBackend)
        assert backend_for_url("mine://x") == "mylocal"
        with pytest.raises(ConfigError):
            register_backend("mylocal", "pipeflow.backends.boto3:Boto3Backend")
    finally:
        unregister_backend("mylocal")
    assert "mylocal" not in known_backends() and backend_for_url("mine://x") == "fsspec"
    with pytest.raises(ConfigError):
        register_backend("broken", "no-colon")


def test_options_are_validated_and_listed() -> None:
    with pytest.raises(ConfigError) as info:
        get_backend("local", no_such_option=1)
    assert "buffer_size" in str(info.value)
    with pytest.raises(ConfigError):
        get_backend("boto3", endpoint="not-a-url")
    with pytest.raises(ConfigError):
        get_backend("boto3", method="carrier-pigeon")
    with pytest.raises(ConfigError):
        S3Options(access_key="AKIA")  # without the secret


def test_a_ready_backend_passes_through() -> None:
    be = get_backend("local")
    assert get_backend(be) is be
    with pytest.raises(ConfigError):
        get_backend(be, buffer_size=1)


def test_credentials_never_show() -> None:
    be = get_backend("boto3", access_key="AKIAEXAMPLE", secret_key="very-secret-value",
                     session_token="tok-secret")
    text = repr(be) + repr(be.options)
    for secret in ("very-secret-value", "tok-secret", "AKIAEXAMPLE"):
        assert secret not in text
    fs = get_backend("fsspec", storage_options={"secret": "hush-hush"})
    assert "hush-hush" not in repr(fs)


def test_backends_pickle_with_options(monkeypatch) -> None:
    be = get_backend("boto3", endpoint="http://127.0.0.1:1", region="eu-west-1")
    clone = pickle.loads(pickle.dumps(be))
    assert isinstance(clone, Backend) and clone.options == be.options


def test_endpoint_resolution(monkeypatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/")
    assert resolve_endpoint() == "http://127.0.0.1:9000"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9001")
    assert resolve_endpoint() == "http://127.0.0.1:9001"
    assert resolve_endpoint("http://h:1") == "http://h:1"
    assert S3Options().use_path_style()
    assert not S3Options(path_style=False).use_path_style()
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert resolve_endpoint() is None and not S3Options().use_path_style()


def test_an_endpoint_without_a_scheme_is_a_config_error_naming_its_source(monkeypatch) -> None:
    # each SDK fails its own way on a bare host:port (obstore panics in Rust); one check for all
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "127.0.0.1:9000")
    with pytest.raises(ConfigError, match=r"AWS_ENDPOINT_URL .*'http://127\.0\.0\.1:9000'"):
        resolve_endpoint()
    with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL"):
        S3Options().endpoint_label()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "ftp://h:1")
    with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL_S3") as info:
        resolve_endpoint()
    assert "did you mean" not in str(info.value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "HTTPS://h:1/")
    assert resolve_endpoint() == "HTTPS://h:1"
    # the endpoint= option says the same, where the pipeline is written
    with pytest.raises(ConfigError, match=r"^endpoint must be .*\(did you mean 'http://127\.0\.0\.1:9000'\?\)"):
        S3Options(endpoint="127.0.0.1:9000")
    assert S3Options(endpoint="HTTP://h:1").endpoint == "HTTP://h:1"


@pytest.mark.parametrize("backend", ["obstore", "boto3"])
def test_a_pipeline_on_an_endpoint_without_a_scheme_fails_with_the_config_error(monkeypatch, backend) -> None:
    pytest.importorskip(backend)
    import pipeflow as pf

    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "127.0.0.1:9")
    pipe = pf.from_items(["s3://bucket/k"]).open(backend, read=True, workers=1)
    with pytest.raises(ConfigError, match="did you mean 'http://127.0.0.1:9'"):
        next(iter(pipe))


@pytest.mark.parametrize(("status", "code", "cls"), [
    (404, "NoSuchKey", ObjectNotFoundError), (404, "", ObjectNotFoundError),
    (403, "AccessDenied", AccessDeniedError), (400, "InvalidBucketName", InvalidURLError),
])
def test_error_codes_map_to_types(status: int, code: str, cls: type) -> None:
    err = error_for_status(status, code, url="s3://b/k", backend="x", op="open")
    assert type(err) is cls
    assert err.url == "s3://b/k" and "backend=x" in str(err)
    assert pickle.loads(pickle.dumps(err)).url == "s3://b/k"


@pytest.mark.parametrize("url, meant", [
    ("https://bkt.s3.amazonaws.com/train/", "s3://bkt/train/"),
    ("https://my.bkt.s3.us-west-2.amazonaws.com/a/b", "s3://my.bkt/a/b"),
    ("https://s3.us-east-1.amazonaws.com/bkt/train/", "s3://bkt/train/"),
    ("https://s3-eu-west-1.amazonaws.com/bkt/x", "s3://bkt/x"),
    ("https://example.com/bkt/x", None), ("http://127.0.0.1:9000/bkt/x", None),
])
def test_listing_an_s3_prefix_over_https_names_the_s3_url(url, meant) -> None:
    """An HTTP listing of S3 finds no links and read "no objects"; nothing is sent now."""
    from pipeflow.backends._s3config import on_aws_s3

    assert on_aws_s3(url) == meant
    if meant is not None:
        with pytest.raises(InvalidURLError, match=f"name it '{meant}'"):
            list(get_backend("fsspec").list(url))


def test_a_protocol_whose_filesystem_is_missing_raises_missing_dependency_error() -> None:
    # fsspec raises a bare ImportError; pipeflow's typed one keeps its hint and pickles
    import importlib.util

    pytest.importorskip("fsspec")
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here")
    import pipeflow as pf

    with pytest.raises(MissingDependencyError, match=r"gcsfs is required .*pip install gcsfs") as info:
        pf.list_objects("gs://bucket/train/")
    clone = pickle.loads(pickle.dumps(info.value))
    assert str(clone) == str(info.value) and clone.package == "gcsfs"


def test_a_named_backend_without_its_sdk_reports_the_sdk_not_its_options() -> None:
    # its options are unknowable without the SDK: "no option 'endpoint'" would be a false lead
    code = ("import sys; sys.modules['obstore'] = None\n"
            "import pipeflow as pf\n"
            "from pipeflow.errors import MissingDependencyError\n"
            "try:\n"
            "    pf.list_objects('s3://bucket/train/', backend='obstore', endpoint='http://127.0.0.1:1')\n"
            "except MissingDependencyError as exc:\n"
            "    print('MISSING', exc.package)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "MISSING obstore", out.stdout + out.stderr


def test_a_malformed_endpoint_leaves_unrelated_http_urls_readable(monkeypatch, tmp_path) -> None:
    # AWS_ENDPOINT_URL only matters to S3 reads; a plain web file does not use it
    import functools
    import http.server
    import threading

    pytest.importorskip("aiohttp")
    (tmp_path / "a.bin").write_bytes(b"hello")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "127.0.0.1:9")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    backend = get_backend("fsspec")
    try:
        assert backend.read(f"http://127.0.0.1:{server.server_port}/a.bin") == b"hello"
    finally:
        backend.close()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(("url", "package"), [("sftp://h/x/", "paramiko"), ("hdfs://h/x/", "pyarrow")])
def test_a_filesystem_inside_fsspec_names_the_package_it_misses(url, package) -> None:
    # the filesystem class is fsspec's own: installing fsspec again would not help
    pytest.importorskip("fsspec")
    code = (f"import sys; sys.modules[{package!r}] = None\n"
            "import pipeflow as pf\n"
            "from pipeflow.errors import MissingDependencyError\n"
            "try:\n"
            f"    pf.list_objects({url!r})\n"
            "except MissingDependencyError as exc:\n"
            "    print(exc.package); print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    first, _, message = out.stdout.partition("\n")
    assert first == package and f"pip install {package} (" in message, out.stdout
    assert "pip install fsspec" not in message


def test_a_missing_filesystem_with_no_module_named_gives_fsspecs_hint_alone() -> None:
    pytest.importorskip("fsspec")
    from pipeflow.backends.fsspec import _missing_filesystem

    err = _missing_filesystem("sftp", ImportError("SFTPFileSystem requires paramiko"))
    assert "pip install" not in str(err) and "requires \"paramiko\"" in str(err)
    assert err.package != "fsspec"
    assert pickle.loads(pickle.dumps(err)).package == err.package


@pytest.mark.parametrize("backend", ["boto3", "iopath", "s3torchconnector", "obstore"])
def test_a_profile_that_does_not_exist_is_a_config_error_naming_it(monkeypatch, tmp_path, backend) -> None:
    pytest.importorskip(backend)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    # an endpoint that refuses: the CRT's client said so (after its retries) instead of the profile
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="no AWS profile named 'nope' in the shared config files"):
        get_backend(backend, profile="nope").read("s3://bucket/k")   # before any request
    monkeypatch.setenv("AWS_PROFILE", "typo")
    with pytest.raises(ConfigError, match="no AWS profile named 'typo'"):
        get_backend(backend).read("s3://bucket/k")


def test_the_profiles_of_the_shared_files_are_found_as_botocore_reads_them(monkeypatch, tmp_path) -> None:
    from pipeflow.backends._s3config import profile_names

    (tmp_path / "config").write_text("[default]\nregion = x\n[profile real]\nregion = y\n"
                                      "[profile  spaced ]\n")
    (tmp_path / "credentials").write_text("[keys]\naws_access_key_id = a\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    assert {"default", "real", "spaced", "keys"} <= profile_names()
    if importlib.util.find_spec("botocore") is not None:
        import botocore.session

        assert profile_names() == set(botocore.session.Session().available_profiles)
    pytest.importorskip("s3torchconnector")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name in ("real", "keys", "default"):
        get_backend("s3torchconnector", profile=name).options.check_profile()  # no error
