"""Security: nothing lands on disk outside its target directory whatever the object keys say,
credentials never appear in reprs, explain(), errors or logs, and unpickling is opt-in only."""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import pytest

import pipeflow as pf
from pipeflow import errors
from pipeflow.backends.registry import get_backend
from pipeflow.graph import format_value

SECRET = "pfSECRETdistinctive-9f8e7d6c"
TOKEN = "pfTOKENdistinctive-1a2b3c4d"

#: object keys that try to escape a local directory
HOSTILE_KEYS = ["../../../escape-1.bin", "a/../../escape-2.bin", "/abs/escape-3.bin",
                "..\\..\\escape-4.bin", "-rf escape 5.bin", "new\nline-6.bin", "x/./../../../escape-7.bin"]


def _inside(root: Path, path: str) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def _files_outside(root: Path, before: set[str]) -> set[str]:
    # anything new next to the target dir (where ../ would have led) is an escape
    parent = root.parent
    return {str(p) for p in parent.rglob("*escape*")} - before


@pytest.mark.s3
@pytest.mark.parametrize("backend", ["s5cmd", "boto3"])
def test_fetch_batch_keeps_hostile_keys_inside_its_staging_dir(s3, s3_bucket, tmp_path, backend):
    client = s3.client()
    urls = []
    for i, key in enumerate(HOSTILE_KEYS):
        try:  # HTTP path normalisation stops some of them before they reach the server
            client.put_object(Bucket=s3_bucket, Key=key, Body=f"payload {i}".encode())
        except Exception:
            continue
        urls.append(f"s3://{s3_bucket}/{key}")
    assert len(urls) >= 4, urls
    target = tmp_path / "deep" / "staging"
    target.mkdir(parents=True)
    before = _files_outside(target, set())
    pipe = pf.from_items(urls).fetch_batch(backend, batch_size=3, to=str(target), output="path",
                                           delete=False, on_error="skip")
    delivered = 0
    for rec in pipe:
        path = rec if isinstance(rec, str) else getattr(rec, "data", rec)
        path = path if isinstance(path, str) else str(path)
        assert _inside(target, path), f"{path} is outside {target}"
        delivered += 1
    assert delivered + sum(c.get("skipped", 0) for c in pipe.stats().values()) == len(urls)
    assert _files_outside(target, before) == set()


def test_cache_keeps_hostile_urls_inside_its_directory(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "data.bin").write_bytes(b"abc")
    cache_dir = tmp_path / "deep" / "cache"
    urls = [str(src / "data.bin"), str(src / ".." / "src" / "data.bin"),
            "file://" + str(src / "." / "data.bin")]
    before = _files_outside(cache_dir, set())
    records = list(pf.from_items(urls).cache(str(cache_dir), max_bytes=1 << 20))
    assert [r.data for r in records] == [b"abc"] * 3
    for path in cache_dir.rglob("*"):
        assert _inside(cache_dir, str(path))
        assert not path.is_symlink()
    assert _files_outside(cache_dir, before) == set()


# ---- credentials ------------------------------------------------------------------------------
def test_backend_reprs_and_pickles_never_show_credentials():
    be = get_backend("boto3", access_key="AKIAPFTEST", secret_key=SECRET, session_token=TOKEN)
    for text in (repr(be), str(be), repr(be.options), repr(pickle.loads(pickle.dumps(be)))):
        assert SECRET not in text and TOKEN not in text


def test_explain_errors_logs_and_stats_never_show_credentials(caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    pipe = pf.from_items(["s3://pf-no-such-bucket/k.tar"]).open(
        "boto3", endpoint="http://127.0.0.1:9", access_key="AKIAPFTEST", secret_key=SECRET,
        session_token=TOKEN, retry={"max_attempts": 1})
    shown = [pipe.explain(), repr(pipe)]
    with pytest.raises(errors.PipeflowError) as info:
        list(pipe)
    shown += [str(info.value), repr(info.value), *getattr(info.value, "__notes__", [])]
    # pipeflow's own log records (botocore's DEBUG logging of signed headers is outside its control)
    shown += [r.getMessage() for r in caplog.records if r.name.startswith("pipeflow")]
    shown += [repr(pipe.stats())]
    leaked = [text for text in shown if SECRET in text or TOKEN in text]
    assert not leaked, leaked


@pytest.mark.parametrize("value", [
    {"secret_key": SECRET},
    {"AWS_SESSION_TOKEN": TOKEN},
    {"kw": {"Password": SECRET}},
    [{"token": TOKEN}],
    ({"o": {"credentials": SECRET}},),
], ids=["flat", "upper-case", "nested", "in-a-list", "in-a-tuple"])
def test_secrets_inside_option_values_are_redacted(value):
    # options such as fsspec's storage_options or a client's kwargs carry credentials in dicts
    text = format_value(value)
    assert len(text) < 60, "the rendering was cut: the check would prove nothing"
    assert SECRET not in text and TOKEN not in text, text
    assert "***" in text


def test_what_is_not_secret_is_still_shown():
    assert format_value({"region": "local-1", "kw": {"endpoint": "e"}}) == \
        "{'region': 'local-1', 'kw': {'endpoint': 'e'}}"


# ---- pickle -----------------------------------------------------------------------------------
class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "code ran"))


@pytest.mark.parametrize("field", ["payload.pyd", "payload.pickle", "payload.pkl", "payload.pt"])
def test_unpickling_is_opt_in(tmp_path, field):
    marker = tmp_path / "pwned"
    data = pickle.dumps(_Evil(str(marker)))
    sample = {"__key__": "evil-1", field: data}
    with pytest.raises(errors.PipeflowError) as info:
        list(pf.from_items([sample]).decode())
    assert "evil-1" in str(info.value)
    assert not marker.exists(), "decoding ran code from the data"
    with pytest.raises(errors.ConfigError):
        pf.from_items([sample]).decode(handlers={field.split(".")[-1]: "pickle"})
    assert not marker.exists()


def test_pickle_decoding_works_when_allowed(tmp_path):
    sample = {"__key__": "ok", "obj.pyd": pickle.dumps({"a": 1})}
    (out,) = list(pf.from_items([sample]).decode(allow_pickle=True))
    assert out["obj.pyd"] == {"a": 1}
