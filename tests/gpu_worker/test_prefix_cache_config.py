"""The worker's prefix-cache switch: on by default, off with ``SYMPHONY_PREFIX_CACHE=0`` or
``--no-prefix-cache`` (the flag wins over the environment)."""

from __future__ import annotations

import pytest

from gpu_worker.__main__ import _parser, build_config


@pytest.mark.parametrize(
    ("env", "argv", "want"),
    [
        (None, [], True),
        ("0", [], False),
        ("off", [], False),
        ("1", [], True),
        ("0", ["--prefix-cache"], True),
        (None, ["--no-prefix-cache"], False),
    ],
)
def test_prefix_cache_switch(monkeypatch, env, argv, want) -> None:
    if env is None:
        monkeypatch.delenv("SYMPHONY_PREFIX_CACHE", raising=False)
    else:
        monkeypatch.setenv("SYMPHONY_PREFIX_CACHE", env)
    assert build_config(_parser().parse_args(argv)).prefix_cache is want
