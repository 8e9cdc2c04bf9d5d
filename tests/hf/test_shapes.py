"""Published model shapes without a download: the shipped config.json files give the published parameter counts.

Counted on the meta device (no memory) from zero_train/assets/model_shapes/, the files copied from each model's
hub repository; arithmetic by hand from the architecture (tests/hf/test_models.py's formulas) says the same.
A config.json path works the same way; one that is not a causal LM is one clear error.
"""

from __future__ import annotations

import json

import pytest
import torch

from zero_train.hf import models, shapes
from zero_train.runtime.errors import UsageError

pytestmark = pytest.mark.tier("quick")


def llama_params(vocab, hidden, layers, inner, heads, kv_heads, *, bias=False):
    """Embedding + LM head (untied) + per block: q, k, v, o, three MLP matrices, two RMSNorms; final norm."""
    kv = hidden // heads * kv_heads
    attention = hidden * (hidden + 2 * kv) + hidden * hidden + ((hidden + 2 * kv) if bias else 0)
    return 2 * vocab * hidden + layers * (attention + 3 * hidden * inner + 2 * hidden) + hidden


@pytest.mark.parametrize("name", list(shapes.SHAPE_PRESETS))
def test_shipped_shapes_have_the_published_parameter_counts(name):
    config = models.model_config(name)
    with torch.device("meta"):
        model = models.build_model(config)
    assert models.count_params(model) == shapes.PUBLISHED_PARAMS[name]


def test_published_counts_follow_from_the_architectures():
    assert (
        shapes.PUBLISHED_PARAMS["llama-3-8b"] == llama_params(128256, 4096, 32, 14336, 32, 8) == 8_030_261_248
    )
    assert shapes.PUBLISHED_PARAMS["llama-2-7b"] == llama_params(32000, 4096, 32, 11008, 32, 32)
    assert shapes.PUBLISHED_PARAMS["llama-2-70b"] == llama_params(32000, 8192, 80, 28672, 64, 8)
    assert shapes.PUBLISHED_PARAMS["mistral-7b"] == llama_params(32000, 4096, 32, 14336, 32, 8)
    qwen = llama_params(152064, 3584, 28, 18944, 28, 4, bias=True)
    assert shapes.PUBLISHED_PARAMS["qwen2.5-7b"] == qwen
    # Qwen2.5-7B's model card: 7.61B parameters, 6.53B without the (untied) embeddings
    assert abs(qwen - 7.61e9) < 0.01e9 and abs(qwen - 2 * 152064 * 3584 - 6.53e9) < 0.01e9


def test_a_config_json_file_is_a_model_and_a_non_causal_lm_is_one_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text((shapes.SHAPES_DIR / "llama-3-8b.json").read_text())
    config = models.model_config(str(path))
    assert (config.model_type, config.vocab_size, models.max_context(config)) == ("llama", 128256, 8192)
    path.write_text(json.dumps(dict(model_type="t5", d_model=64)))
    with pytest.raises(UsageError, match="'t5' config, not a causal LM"):
        models.model_config(str(path))
    path.write_text(json.dumps(dict(hidden_size=64)))
    with pytest.raises(UsageError, match="has no model_type"):
        models.model_config(str(path))
