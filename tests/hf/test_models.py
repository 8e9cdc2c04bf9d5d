"""Presets, parameter counts (against hand arithmetic), the shipped offline tokenizer, load/save round trips,
hub names that cannot be resolved."""

import os
import subprocess
import sys

import pytest
import torch

from zero_train.hf import models as hf
from zero_train.hf import offline
from zero_train.runtime.errors import UsageError

pytestmark = pytest.mark.tier("quick")


def gpt2_params(vocab: int, n_positions: int, d: int, n_layer: int, d_ff: int) -> int:
    """GPT-2 with tied lm_head: wte + wpe + layers (2 LayerNorms, qkv, proj, fc, fc-proj) + final LayerNorm."""
    per_layer = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * d_ff + d_ff) + (d_ff * d + d)
    return vocab * d + n_positions * d + n_layer * per_layer + 2 * d


def llama_params(vocab: int, d: int, n_layer: int, d_ff: int, heads: int, kv_heads: int, tied: bool) -> int:
    """Llama: embed (+ untied lm_head) + layers (q, k, v, o without bias, SwiGLU, 2 RMSNorms) + final norm."""
    kv_dim = d // heads * kv_heads
    per_layer = d * d + 2 * d * kv_dim + d * d + 3 * d * d_ff + 2 * d
    return vocab * d * (1 if tied else 2) + n_layer * per_layer + d


def test_tiny_preset_matches_hand_arithmetic_and_is_under_1m():
    model = hf.load_model("tiny")
    expected = gpt2_params(8192, 256, 64, 2, 256)
    assert hf.count_params(model) == expected == 640_768
    assert expected < 1_000_000
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: counted once
    assert hf.count_params(model) == sum(p.numel() for n, p in model.named_parameters(remove_duplicate=True))


def test_llama_tiny_matches_hand_arithmetic():
    model = hf.load_model("llama-tiny")
    assert hf.count_params(model) == llama_params(8192, 64, 2, 176, 4, 2, tied=True) == 616_768


@pytest.mark.parametrize("name", list(hf.PRESETS))
def test_every_preset_builds_on_meta(name):
    config = hf.model_config(name)
    with torch.device("meta"):
        model = hf.build_model(config)
    assert config.vocab_size == offline.OFFLINE_VOCAB_SIZE
    assert config.eos_token_id == offline.EOS_TOKEN_ID < config.vocab_size
    assert hf.count_params(model) > 0
    assert name in hf.PRESET_SUMMARY


def test_presets_at_their_published_shapes():
    """gpt2-small at GPT-2's own vocabulary is GPT-2 124M (124,439,808 parameters)."""
    with torch.device("meta"):
        small = hf.build_model(hf.model_config("gpt2-small", vocab_size=50257))
        llama = hf.build_model(hf.model_config("llama-60m"))
    assert hf.count_params(small) == gpt2_params(50257, 1024, 768, 12, 3072) == 124_439_808
    assert hf.count_params(llama) == llama_params(8192, 640, 10, 1728, 10, 10, tied=False)


def test_block_size_above_context_is_a_usage_error():
    config = hf.model_config("tiny")
    assert hf.max_context(config) == 256
    hf.check_block_size(config, 256)
    with pytest.raises(UsageError, match="--block-size 257"):
        hf.check_block_size(config, 257)


def test_offline_tokenizer_round_trips_any_text_and_compresses_code():
    tokenizer = hf.load_tokenizer()
    assert len(tokenizer) == offline.OFFLINE_VOCAB_SIZE
    assert tokenizer.eos_token_id == offline.EOS_TOKEN_ID
    assert tokenizer.convert_ids_to_tokens(offline.EOS_TOKEN_ID) == offline.EOS_TOKEN
    text = "héllo wörld \U0001f389\n\tdef f(x):  return x  # 数学\r\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert offline.EOS_TOKEN_ID not in ids
    source = offline.stdlib_files(200_000)
    sample = "".join(path.read_text() for path in source)
    num_tokens = len(tokenizer(sample, add_special_tokens=False)["input_ids"])
    assert len(sample) / num_tokens > 3.0  # chars per token on stdlib code (bytes would give 1.0)


def test_stdlib_files_are_deterministic_and_bounded():
    files = offline.stdlib_files(500_000)
    assert files == offline.stdlib_files(500_000)
    assert sum(path.stat().st_size for path in files) <= 500_000
    every = offline.stdlib_files()  # one walk of the whole library (~600 files read) for both checks
    assert files == every[: len(files)]
    assert not any("test" in path.relative_to(offline.stdlib_dir()).parts for path in every)


def test_saved_model_loads_with_identical_logits(tmp_path):
    torch.manual_seed(0)
    model = hf.load_model("tiny").eval()
    model.save_pretrained(tmp_path)
    loaded = hf.load_model(str(tmp_path)).eval()
    ids = torch.randint(0, 8192, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_missing_folder_and_unknown_hub_model_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no such folder"):
        hf.model_config(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="did you mean 'tiny'"):
        hf.load_model("tiyn")
    with pytest.raises(UsageError, match="cannot read .* as a config.json"):
        (tmp_path / "f.bin").write_bytes(b"x")
        hf.model_config(str(tmp_path / "f.bin"))
    with pytest.raises(UsageError, match="is a file"):
        hf.load_tokenizer(str(tmp_path / "f.bin"))


def test_uncached_hub_tokenizer_and_broken_folder_are_usage_errors(tmp_path):
    with pytest.raises(
        UsageError, match="tokenizer 'someone/tokenizer': it is not cached and HF_HUB_OFFLINE"
    ):
        hf.load_tokenizer("someone/tokenizer")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="cannot load model from folder"):
        hf.model_config(str(tmp_path))


RESOLVE_UNKNOWN = """
import time
from zero_train.hf.models import model_config
from zero_train.runtime.errors import UsageError

start = time.perf_counter()
try:
    model_config("someone/no-such-model")
except UsageError as err:
    print(f"{time.perf_counter() - start:.3f}")
    print(err)
"""


@pytest.mark.parametrize(
    "endpoint", [None, "http://127.0.0.1:9"]
)  # this machine's network (none here); a closed port
@pytest.mark.tier("slow")
def test_an_unknown_hub_model_without_hf_hub_offline_is_one_line_in_under_5_s(endpoint):
    """Not HF_HUB_OFFLINE, no network: one line, within 5 s of asking (huggingface_hub alone retries ~25 s)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update({"HF_ENDPOINT": endpoint} if endpoint else {})
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE_UNKNOWN], env=env, capture_output=True, text=True, timeout=300
    )
    seconds, message = done.stdout.strip().splitlines()
    assert float(seconds) < 5, done.stdout
    assert message.startswith("model 'someone/no-such-model': it is not") and "presets: tiny" in message
    assert done.stderr == ""  # no "Retrying in 8s" lines, no warning
