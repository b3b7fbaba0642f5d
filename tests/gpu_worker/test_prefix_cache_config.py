"""The worker's configuration from its flags: the prefix-cache switch (on by default, off with
``SYMPHONY_PREFIX_CACHE=0`` or ``--no-prefix-cache``; the flag wins over the environment) and
paths made absolute."""

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


def test_a_relative_sessions_dir_is_made_absolute(tmp_path, monkeypatch) -> None:
    """The documented add-a-worker procedure passes ``--sessions-dir var/run/<name>/sessions``:
    session socket paths are bind-mounted into sandboxes, and Docker refuses relative sources."""
    monkeypatch.chdir(tmp_path)
    config = build_config(_parser().parse_args(["--sessions-dir", "var/run/w/sessions"]))
    assert config.sessions_dir == str(tmp_path / "var/run/w/sessions")
