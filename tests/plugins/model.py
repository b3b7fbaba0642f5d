"""Model fixtures: the real default model (converted once) and a tiny random Llama for speed."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real SmolLM2-135M-Instruct directory (converted from the bundled GGUF if needed)."""
    from gpu_worker.model_store import ensure_default_model

    try:
        return ensure_default_model()
    except Exception as exc:
        pytest.fail(f"default model could not be prepared: {exc!r}")


@pytest.fixture(scope="session")
def tiny_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random float32 Llama with the real tokenizer (same token ids, random weights)."""
    from gpu_worker.model_store import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), default_model_dir)
