"""``--kv-other-model``: the second checkpoint the model-isolation clauses serve beside a model
directory. One that is no model directory, or the model itself, ends the run before any engine
starts (exit 4), as a malformed option does; none leaves a directory's clauses Not runnable."""

from __future__ import annotations

import pytest

from conformance.levels.connector.session import _other_checkpoint
from conformance.plugin import options
from conformance.plugin.fixtures import other_model


class Config:
    def __init__(self, **given: str | None) -> None:
        self.given = given

    def getoption(self, name: str) -> str | None:
        return self.given.get(name)


def test_a_checkpoint_given_is_taken_and_a_bad_one_ends_the_run(tmp_path):
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    for model in (base, tuned):
        model.mkdir()
        (model / "config.json").write_text("{}")
    assert other_model(Config(**{options.MODEL: str(base), options.OTHER_MODEL: str(tuned)})) == tuned
    assert other_model(Config(**{options.MODEL: str(base)})) is None
    for bad, says in ((tmp_path / "nowhere", "not a model directory"), (base, "is --kv-model itself")):
        with pytest.raises(pytest.exit.Exception, match=says) as info:
            other_model(Config(**{options.MODEL: str(base), options.OTHER_MODEL: str(bad)}))
        assert info.value.returncode == 4


def test_the_connector_level_serves_the_checkpoint_given_else_its_own_for_a_recipe(tmp_path):
    assert _other_checkpoint(str(tmp_path), None) is None  # a directory and nothing given: Not runnable
    given = _other_checkpoint(str(tmp_path), tmp_path / "tuned")
    assert given is not None and given() == tmp_path / "tuned"
    assert _other_checkpoint("qwen3-tiny", None) is not None  # the recipe's, made when first asked
