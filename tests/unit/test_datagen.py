"""The synthetic data generator: determinism, layouts, content, shard sizes."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
from PIL import Image

from pipeflow.cli import main
from pipeflow.errors import AccessDeniedError, ConfigError, InvalidURLError
from pipeflow.formats.example import decode_example
from pipeflow.formats.tfrecord import iter_tfrecords
from pipeflow.testing.datagen import LAYOUTS, generate, iter_samples, sample_fields, sample_key


def test_samples_are_deterministic_and_seed_dependent():
    a = sample_fields("single", 3, image_size=16, seed=1)
    assert a == sample_fields("single", 3, image_size=16, seed=1)
    assert a != sample_fields("single", 3, image_size=16, seed=2)
    assert a != sample_fields("single", 4, image_size=16, seed=1)


def test_png_pair_is_rgb_image_and_class_map():
    fields = sample_fields("wds", 0, image_size=24)
    image = Image.open(io.BytesIO(fields["image"]))
    label = Image.open(io.BytesIO(fields["label"]))
    assert image.format == "PNG" and image.mode == "RGB" and image.size == (24, 24)
    assert label.format == "PNG" and label.mode == "L" and label.size == (24, 24)
    assert np.asarray(label).max() > 200  # 256 classes, uniformly drawn


def test_jpeg_sample_is_about_115_kb_by_default():
    fields = sample_fields("jpeg", 0)
    assert Image.open(io.BytesIO(fields["jpg"])).format == "JPEG"
    assert 95_000 < len(fields["jpg"]) < 135_000
    assert 0 <= int(fields["cls"]) < 256


def test_single_layout_writes_one_object_per_field(tmp_path):
    result = generate("single", str(tmp_path), count=5, image_size=8, seed=7)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"{sample_key(i)}.{f}" for i in range(5) for f in ("image", "label"))
    assert list(result.objects) == [f"{sample_key(i)}.{f}" for i in range(5) for f in ("image", "label")]
    for key, fields in iter_samples("single", 5, image_size=8, seed=7):
        for name, data in fields.items():
            assert (tmp_path / f"{key}.{name}").read_bytes() == data


@pytest.mark.parametrize("layout", ["wds", "jpeg-shards"])
def test_tar_shards_hold_every_sample_in_order_near_the_target_size(tmp_path, layout):
    count = 30
    expected = dict(iter_samples(layout, count, image_size=16))
    per_sample = sum(len(v) for v in expected["000000"].values())
    shard_mb = per_sample * 4 / 1e6
    result = generate(layout, str(tmp_path), count=count, image_size=16, shard_mb=shard_mb)
    assert len(result.objects) == 8  # ceil(30 / 4)
    members = []
    for name in result.objects:
        with tarfile.open(tmp_path / name) as tar:
            for m in tar.getmembers():
                members.append((m.name, tar.extractfile(m).read()))
    fields = LAYOUTS[layout].fields
    assert members == [(f"{k}.{f}", expected[k][f]) for k in sorted(expected) for f in fields]


def test_shards_are_byte_identical_for_the_same_seed(tmp_path):
    generate("wds", str(tmp_path / "a"), count=6, image_size=8, shard_mb=0.001)
    generate("wds", str(tmp_path / "b"), count=6, image_size=8, shard_mb=0.001)
    for path in (tmp_path / "a").iterdir():
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes()


def test_tfrecord_layout_holds_examples(tmp_path):
    result = generate("tfrecord", str(tmp_path), count=7, image_size=8, shard_mb=0.002)
    expected = dict(iter_samples("tfrecord", 7, image_size=8))
    got = {}
    for name in result.objects:
        with open(tmp_path / name, "rb") as f:
            for payload in iter_tfrecords(f, name):
                ex = decode_example(payload)
                got[ex["key"][0].decode()] = {"image": ex["image"][0], "label": ex["label"][0]}
    assert got == expected
    assert len(result.objects) > 1


def test_s3_target(s3, s3_bucket):
    result = generate("jpeg", f"s3://{s3_bucket}/jpeg", count=3, image_size=8)
    client = s3.client()
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert keys == sorted(f"jpeg/{n}" for n in result.objects)
    body = client.get_object(Bucket=s3_bucket, Key="jpeg/000001.jpg")["Body"].read()
    assert body == sample_fields("jpeg", 1, image_size=8)["jpg"]


def test_s3_target_without_credentials_is_access_denied(s3, s3_bucket, tmp_path, monkeypatch, capsys):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    boto3 = pytest.importorskip("boto3")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)   # its credentials were found before
    with pytest.raises(AccessDeniedError, match="no usable credentials"):
        generate("jpeg", f"s3://{s3_bucket}/jpeg", count=1, image_size=8)
    assert main(["make-data", "jpeg", f"s3://{s3_bucket}/jpeg", "--count", "1", "--quiet"]) == 2
    assert "no usable credentials" in capsys.readouterr().err


def test_invalid_options(tmp_path):
    with pytest.raises(ConfigError, match="layout"):
        generate("parquet", str(tmp_path))
    with pytest.raises(ConfigError):
        generate("wds", str(tmp_path), shard_mb=0)
    with pytest.raises(ConfigError):
        generate("wds", "gs://bucket/x")


def test_a_mistyped_url_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """``s3:/bucket/x`` (one slash) is a typo, not the local directory ``./s3:/bucket/x``; a
    bucket name S3 cannot have is named as such, not as a bucket that does not exist."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidURLError, match="did you mean 's3://bucket/x'"):
        generate("jpeg", "s3:/bucket/x", count=1, image_size=8)
    with pytest.raises(InvalidURLError, match="invalid bucket name 'My_Bucket'"):
        generate("jpeg", "s3://My_Bucket/x", count=1, image_size=8)
    assert main(["make-data", "jpeg", "s3:/bucket/x", "--count", "1", "--quiet"]) == 2
    assert "did you mean 's3://bucket/x'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    generate("jpeg", (tmp_path / "out").as_uri(), count=1, image_size=8)   # file:// still works
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["000000.cls", "000000.jpg"]


def test_make_data_cli(tmp_path, capsys):
    assert main(["make-data", "jpeg-shards", str(tmp_path), "--count", "4", "--image-size", "8",
                 "--shard-mb", "0.0001", "--quiet"]) == 0
    assert "wrote 4 samples" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000.tar", "00001.tar", "00002.tar", "00003.tar"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tqdm_installed", [True, False])
def test_ctrl_c_mid_way_ends_the_bar_before_the_interrupted_line(tmp_path, monkeypatch, tqdm_installed):
    import pipeflow.testing.datagen as datagen

    if not tqdm_installed:
        monkeypatch.setitem(__import__("sys").modules, "tqdm", None)   # the hand-drawn bar

    def interrupted(layout, count, **kwargs):
        yield from list(iter_samples(layout, 2, **kwargs))
        raise KeyboardInterrupt

    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setattr(datagen, "iter_samples", interrupted)
    assert main(["make-data", "single", str(tmp_path / "d"), "--count", "5", "--image-size", "8"]) == 130
    shown = terminal.getvalue()
    bar, _, after = shown.rpartition("\n" + "pipeflow make-data: interrupted\n")
    assert bar and "2/5" in bar.rsplit("\r", 1)[-1] and after == "", repr(shown)


def test_the_data_tools_check_the_endpoint_as_the_backends_do(monkeypatch):
    # make-data and upload went through botocore's bare ValueError('Invalid endpoint') traceback
    pytest.importorskip("boto3")
    from pipeflow.testing.datagen import s3_client

    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "127.0.0.1:9000")
    with pytest.raises(ConfigError, match="did you mean 'http://127.0.0.1:9000'"):
        s3_client()


@pytest.mark.parametrize("size", [0, -1])
def test_an_image_size_of_zero_or_less_is_refused_not_taken_for_the_default(tmp_path, size):
    # 0 meant the default (1024 px for PNG layouts): a minute of generating where an error was due
    with pytest.raises(ConfigError, match=f"image_size must be >= 1, got {size}"):
        generate("wds", str(tmp_path / "out"), count=3, image_size=size)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=f"image_size must be >= 1, got {size}"):
        sample_fields("single", 0, image_size=size)
