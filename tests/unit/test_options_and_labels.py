"""Stage options as a new user meets them: a misspelled option names the nearest valid one;
every stage has one short label, used by explain(), stats() and the end-of-epoch skip warning."""

from __future__ import annotations

import io
import logging
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest

import pipeflow as pf
from pipeflow.errors import ConfigError, OptionError
from pipeflow.stages.base import Stage


def test_a_misspelled_stage_option_suggests_the_valid_one():
    with pytest.raises(OptionError) as err:
        pf.from_items(range(3)).shuffle(bufer_size=10)
    message = str(err.value)
    assert "'bufer_size'" in message and "did you mean 'buffer_size'?" in message
    assert "valid options: buffer_size, seed" in message
    # what users already catch keeps working
    assert isinstance(err.value, TypeError) and isinstance(err.value, ConfigError)


@pytest.mark.parametrize(("build", "wrong", "right"), [
    (lambda p: p.map(abs, worker=2), "worker", "workers"),
    (lambda p: p.batch(4, droplast=True), "droplast", "drop_last"),
    (lambda p: p.decode(resise=32), "resise", "resize"),
    (lambda p: p.equalize(per_shards=3), "per_shards", "per_shard"),
    (lambda p: pf.interleave([p], stopp="all"), "stopp", "stop"),
])
def test_every_building_method_checks_its_option_names(build, wrong, right):
    with pytest.raises(OptionError, match=rf"no option '{wrong}' \(did you mean '{right}'\?\)"):
        build(pf.from_items(range(3)))


class Every(Stage[Any]):
    def __init__(self, source: Stage[Any], *, step: int = 1) -> None:
        super().__init__(source)
        self.step = step

    def next(self) -> Any:
        item = next(self.source)
        for _ in range(self.step - 1):
            next(self.source, None)
        return item


@pytest.mark.parametrize("backend", [None, "local"])
@pytest.mark.parametrize(("wrong", "right"), [("wokers", "workers"), ("red", "read"),
                                              ("on_eror", "on_error")])
def test_a_misspelled_open_option_is_named_not_taken_for_a_backend_option(backend, wrong, right):
    # open() passes its unknown keywords on to the backend; a typo of its own option must not
    # be reported as a backend option needing backend= (or as a backend's TypeError)
    with pytest.raises(OptionError) as err:
        pf.from_items(["s3://bucket/key"]).open(backend, read=True, **{wrong: 4})
    message = str(err.value)
    assert f"no option '{wrong}' (did you mean '{right}'?)" in message
    assert "explicit backend" not in message


def test_a_misspelled_backend_option_suggests_the_backends_own():
    with pytest.raises(OptionError, match=r"no option 'page_sise' \(did you mean 'page_size'\?\).*"
                                          r"'boto3' backend's options: .*page_size"):
        pf.from_items(["s3://bucket/key"]).open("boto3", page_sise=10)


@pytest.mark.parametrize(("backend", "wrong", "right"), [(None, "patern", "pattern"),
                                                         (None, "thread", "threads"),
                                                         ("boto3", "endpoit", "endpoint")])
def test_a_misspelled_list_objects_option_is_named_before_anything_is_listed(tmp_path, backend,
                                                                             wrong, right):
    # list_objects passes unknown keywords to the backend too: a slip there was a TypeError of
    # the backend's options class, with no suggestion
    with pytest.raises(OptionError) as err:
        pf.list_objects(str(tmp_path / "missing") + "/", backend=backend, **{wrong: "*.tar"})
    message = str(err.value)
    assert f"list_objects() has no option '{wrong}' (did you mean '{right}'?)" in message
    assert "pattern, backend, manifest, threads" in message
    assert "__init__" not in message


def test_a_real_backend_option_without_a_backend_asks_for_the_name():
    with pytest.raises(ConfigError) as err:
        pf.from_items(["s3://bucket/key"]).open(endpoint="http://127.0.0.1:1")
    assert "'endpoint' is a backend option" in str(err.value)
    assert 'open("obstore", endpoint=...)' in str(err.value)


def test_a_custom_stage_option_is_checked_against_its_constructor():
    with pytest.raises(OptionError, match=r"Every\(\) has no option 'stpe' \(did you mean 'step'\?\)"):
        pf.from_items(range(3)).then(Every, stpe=2)
    assert list(pf.from_items(range(6)).then(Every, step=2)) == [0, 2, 4]


def test_an_option_given_by_position_and_by_keyword_names_both_values():
    # decode's first argument is its output mode; mode="RGB" reads like an image mode
    with pytest.raises(OptionError, match=r"^decode\(\): 'mode' is given twice: 'torch' by position "
                                          r"and mode='RGB'$"):
        pf.from_items(range(3)).decode("torch", resize=8, mode="RGB")


def test_a_missing_argument_is_an_option_error_too():
    with pytest.raises(OptionError, match="buffer_size"):
        pf.from_items(range(3)).shuffle()


def test_short_labels_key_stats_and_explain():
    pipe = (pf.from_items(range(30)).map(abs).filter(lambda x: x % 3)
            .map(_fail_on_7, on_error="skip").shuffle(4, seed=1))
    drawing = pipe.explain().splitlines()
    assert drawing[0] == "shuffle(4, seed=1)"
    assert drawing[1].strip("└─ ").startswith("map#2(_fail_on_7, ")
    assert drawing[3].strip("└─ ").startswith("map(abs, ")
    list(pipe)
    stats = pipe.stats()
    assert {label: c["skipped"] for label, c in stats.items() if "skipped" in c} == {"map#2": 1}


def _fail_on_7(x: int) -> int:
    if x == 7:
        raise ValueError("seven")
    return x


def _tar(path: Path, members: dict[str, bytes], *, keep: int = 0) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    path.write_bytes(raw[:keep] if keep else raw)
    return str(path)


def test_the_end_of_epoch_warning_lists_every_stages_skips(tmp_path, caplog):
    good = _tar(tmp_path / "a.tar", {"s1.json": b'{"x": 1}', "s2.json": b"{not json"})
    # b.tar ends inside the data of its second member: header, s3 data, header, 1000 of 2002 bytes
    broken = _tar(tmp_path / "b.tar", {"s3.json": b'{"x": 3}', "s4.json": b'"' + b"a" * 2000 + b'"'},
                  keep=3 * 512 + 1000)
    pipe = (pf.from_items([good, broken]).open().untar(on_error="skip").group_pairs()
            .decode(on_error="skip"))
    with caplog.at_level(logging.WARNING, logger="pipeflow"):
        samples = list(pipe)
    assert [s["__key__"] for s in samples] == ["s1", "s3"]
    stats = pipe.stats()
    assert stats["untar"]["skipped_objects"] == 1 and stats["decode"]["skipped"] == 1
    (warning,) = [r.getMessage() for r in caplog.records if "ended with skipped items" in r.getMessage()]
    assert "untar: 1 skipped_objects" in warning and "decode: 1 skipped" in warning


@pytest.mark.parametrize(("option", "where"), [
    ("shuffle", ".shuffle(buffer_size) before loader()"),
    ("num_workers", "DataLoader(pipe, num_workers=N)"),
    ("sampler", "shard_by_rank()"),
])
def test_a_dataloader_option_given_to_loader_says_where_pipeflow_has_it(option, where):
    with pytest.raises(OptionError, match=rf"loader\(\) has no option '{option}' \(.*{re.escape(where)}"):
        pf.from_items(range(4)).loader(batch_size=2, **{option: 1})
