"""The connector level reads a model's vocabulary where its config keeps it (#54): a vision-language
model keeps it in its text model's config, not at the top."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.levels.connector.harness import model_vocab_size
from conformance.verdict.guard import HarnessError


def _model(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("config", [
    {"vocab_size": 2048},
    {"architectures": ["Idefics3ForConditionalGeneration"], "text_config": {"vocab_size": 2048}},
    {"architectures": ["InternVLChatModel"], "llm_config": {"vocab_size": 2048}, "vision_config": {"vocab_size": 7}},
])
def test_the_vocabulary_is_read_where_the_config_keeps_it(tmp_path, config):
    assert model_vocab_size(_model(tmp_path, config)) == 2048


def test_a_config_without_a_vocabulary_is_a_harness_error_naming_where_it_looked(tmp_path):
    with pytest.raises(HarnessError, match="no vocab_size at its top or in text_config"):
        model_vocab_size(_model(tmp_path, {"text_config": {"hidden_size": 64}}))
