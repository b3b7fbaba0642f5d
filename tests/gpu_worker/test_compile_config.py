"""The worker's compile switch from its flags: on by default, off with ``SYMPHONY_COMPILE=off``
(or 0 / false / no) or ``--compile off``; the flag wins over the environment; the cache path is
made absolute."""

from __future__ import annotations

import pytest

from gpu_worker.__main__ import _parser, build_config


@pytest.mark.parametrize(
    ("env", "argv", "want"),
    [
        (None, [], True),
        ("off", [], False),
        ("0", [], False),
        ("on", [], True),
        ("off", ["--compile", "on"], True),
        (None, ["--compile", "off"], False),
    ],
)
def test_compile_switch(monkeypatch, env, argv, want) -> None:
    if env is None:
        monkeypatch.delenv("SYMPHONY_COMPILE", raising=False)
    else:
        monkeypatch.setenv("SYMPHONY_COMPILE", env)
    assert build_config(_parser().parse_args(argv)).compile is want


def test_a_bad_compile_value_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--compile", "maybe"])
    assert "invalid choice" in capsys.readouterr().err


def test_the_compile_cache_is_made_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = build_config(_parser().parse_args(["--compile-cache", "cc"]))
    assert config.compile_cache_dir == str(tmp_path / "cc")
