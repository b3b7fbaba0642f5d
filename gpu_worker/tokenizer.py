"""Text <-> token ids for the served model, shared by every session of a worker.

Wraps a transformers fast tokenizer (Rust ``tokenizers``). The Rust tokenizer mutates internal
truncation/padding state during calls, so concurrent use from several threads is serialised with
a lock; calls are microseconds to milliseconds, far below a forward pass.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class Tokenizer:
    """The model directory's tokenizer and chat template."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(model_dir))
        self._lock = threading.Lock()
        #: Size of the tokenizer's vocabulary (added tokens included); the model's logits may
        #: be wider (padded embedding), never narrower.
        self.vocab_size: int = len(self._tok)
        self.bos_token_id: int | None = self._tok.bos_token_id
        self.eos_token_ids: list[int] = self._eos_ids(Path(model_dir))
        self.chat_template: str | None = self._tok.chat_template

    def _eos_ids(self, model_dir: Path) -> list[int]:
        """EOS ids from the tokenizer plus the generation config (chat models add <|im_end|>)."""
        ids: list[int] = []
        if self._tok.eos_token_id is not None:
            ids.append(int(self._tok.eos_token_id))
        try:
            from transformers import GenerationConfig

            gen = GenerationConfig.from_pretrained(str(model_dir))
            extra = gen.eos_token_id
            for tid in extra if isinstance(extra, list) else [extra]:
                if tid is not None and int(tid) not in ids:
                    ids.append(int(tid))
        except OSError:
            pass
        return ids

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        with self._lock:
            return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        with self._lock:
            return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` rendered with the model's chat template."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template")
        with self._lock:
            text = self._tok.apply_chat_template(
                list(messages), add_generation_prompt=add_generation_prompt, tokenize=False
            )
            return list(self._tok.encode(text, add_special_tokens=False))
