"""The recipe registry: names, metadata, option checking, close-match suggestions, CLI."""

from __future__ import annotations

import json

import pytest

import pipeflow.recipes as recipes
from pipeflow.cli import main
from pipeflow.errors import ConfigError
from pipeflow.recipes import RecipeInfo, UnknownRecipeError
from pipeflow.testing.datagen import LAYOUTS

EXPECTED = {
    "single-boto3", "single-ffm", "single-s5cmd", "single-s5cmd-tmpfs",
    "wds-pipe-cli", "wds-boto3", "wds-s3fs", "wds-s3-plugin", "wds-ffm",
    "torchdata-iopath", "torchdata-fsspec", "torchdata-file", "torchdata-s3fileloader",
    "s3connector-map", "s3connector-shards", "fsspec-random", "mountpoint", "mountpoint-cache",
    "tfrecord-ffm", "tfrecord-pipe", "tfrecord-s3",
}


def test_every_recipe_of_the_issue_is_registered():
    assert set(recipes.names()) == EXPECTED
    infos = recipes.list()
    assert {i.name for i in infos} == EXPECTED
    assert [(i.article, i.name) for i in infos] == sorted((i.article, i.name) for i in infos)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_metadata_is_complete(name):
    info = recipes.get(name)
    assert isinstance(info, RecipeInfo)
    assert info.name == name
    assert info.article in {"000", "001", "002", "003"}
    assert info.layout in LAYOUTS
    assert LAYOUTS[info.layout].article == info.article
    assert info.description and info.backend
    assert set(info.reads) <= {"s3", "local"} and info.reads


def test_002_recipes_offer_the_article_preprocessing():
    for info in recipes.list():
        if info.article == "002":
            assert info.options.get("preprocess") is False
            assert info.batch_size == 128
            assert info.yields_batches({"preprocess": True})
            assert not info.yields_batches()


def test_unknown_name_suggests_close_matches():
    with pytest.raises(UnknownRecipeError) as exc:
        recipes.load("wds-bot03", url="s3://b/x/")
    assert "wds-boto3" in str(exc.value)
    assert isinstance(exc.value, ConfigError)
    with pytest.raises(UnknownRecipeError):
        recipes.get("nothing-like-it")


def test_unknown_option_is_rejected_with_a_hint():
    with pytest.raises(ConfigError) as exc:
        recipes.load("tfrecord-ffm", url="/data", seeed=3)
    assert "seed" in str(exc.value)


def test_an_option_of_the_wrong_kind_is_a_config_error_naming_it(capsys):
    for wrong in ({"shuffle_buffer": "ten"}, {"shuffle_buffer": True}, {"seed": 1.5}):
        with pytest.raises(ConfigError, match=rf"option '{next(iter(wrong))}' must be an int"):
            recipes.load("wds-boto3", url="s3://bucket/wds/", **wrong)
    with pytest.raises(ConfigError, match=r"option 'cycle' must be True or False"):
        recipes.load("torchdata-file", url="/data", cycle="no")
    # from the command line: one line, status 2, no traceback
    assert main(["run", "wds-boto3", "--url", "s3://bucket/wds/", "-o", "shuffle_buffer=ten"]) == 2
    err = capsys.readouterr().err
    assert "option 'shuffle_buffer' must be an int" in err and "Traceback" not in err


def test_url_kind_is_checked():
    with pytest.raises(ConfigError, match="mounted"):
        recipes.load("wds-ffm", url="s3://bucket/wds/")
    with pytest.raises(ConfigError, match="s3://"):
        recipes.load("wds-boto3", url="/data/wds")


def test_cli_lists_recipes(capsys):
    assert main(["recipes"]) == 0
    text = capsys.readouterr().out
    for name in EXPECTED:
        assert name in text
    assert main(["recipes", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == EXPECTED


def test_cli_run_reports_unknown_recipe(capsys):
    assert main(["run", "no-such-recipe", "--url", "s3://b/p/"]) == 2
    assert "no recipe named" in capsys.readouterr().err


def test_run_option_parsing():
    from pipeflow._cli.run import parse_options

    assert parse_options(["seed=3", "to=/dev/shm", "cycle=False", "shuffle-buffer=0"]) == {
        "seed": 3, "to": "/dev/shm", "cycle": False, "shuffle_buffer": 0}
    with pytest.raises(ConfigError):
        parse_options(["novalue"])


def test_every_recipe_says_what_it_is_and_what_each_option_means():
    for info in recipes.list():
        assert info.notes and not info.notes.startswith(info.name), info.name
        missing = [opt for opt in info.options if f"``{opt}``" not in info.option_help]
        assert missing == [], (info.name, missing)


def test_recipes_that_differ_only_in_the_backend_are_one_table():
    from pipeflow.recipes._table import TABLE

    families: dict = {}
    for row in TABLE.values():
        families.setdefault(row.chain.__name__, set()).add(row.backend)
    # each shared chain is read with several backends
    assert all(len(backends) > 1 for backends in families.values()), families
    assert recipes.get("wds-s3fs").backend == "s3fs" and recipes.get("wds-ffm").backend == "local"


def test_a_sample_of_another_layout_is_a_typed_error_naming_both_field_sets():
    import pickle

    from pipeflow.errors import MissingFieldError
    from pipeflow.recipes._common import to_sample

    with pytest.raises(MissingFieldError) as info:
        to_sample(("image", "label"))({"__key__": "k7", "image.png": b"", "label.cls": b"1"})
    assert "fields image, label" in str(info.value) and "has image.png, label.cls" in str(info.value)
    err = info.value
    assert (err.key, err.field, err.fields) == ("k7", "image,label", ("image.png", "label.cls"))
    assert pickle.loads(pickle.dumps(info.value)).fields == ("image.png", "label.cls")  # crosses workers
