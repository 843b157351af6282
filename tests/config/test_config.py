"""hpkv.yaml + HPKV_* + flags: precedence, lookup order and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpkv.config import load_settings, redact
from hpkv.errors import ConfigError


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_without_any_file(isolated_env: Path) -> None:
    settings = load_settings(environ={})
    assert settings.source is None
    assert settings.section("tieredStorage") == {"memoryPercent": 20}
    assert settings.cluster is None


def test_precedence_defaults_file_env_flags(isolated_env: Path) -> None:
    _write(
        isolated_env / "hpkv.yaml",
        "cluster: from-file\nregion: us-east-1\ntieredStorage:\n  memoryPercent: 30\n",
    )
    settings = load_settings(environ={})
    assert (settings.cluster, settings.region) == ("from-file", "us-east-1")
    assert settings.section("tieredStorage")["memoryPercent"] == 30

    env = {"HPKV_CLUSTER": "from-env", "HPKV_TIERED_STORAGE__MEMORY_PERCENT": "40"}
    settings = load_settings(environ=env)
    assert settings.cluster == "from-env"
    assert settings.section("tieredStorage")["memoryPercent"] == 40
    assert settings.region == "us-east-1"

    settings = load_settings(environ=env, flags={"cluster": "from-flag", "region": None})
    assert settings.cluster == "from-flag"
    assert settings.region == "us-east-1"


def test_lookup_order_cwd_then_user_config_dir(isolated_env: Path) -> None:
    user = _write(
        isolated_env / "home" / ".config" / "hpkv" / "hpkv.yaml", "cluster: from-user-dir\n"
    )
    settings = load_settings()
    assert settings.cluster == "from-user-dir" and settings.source == user
    _write(isolated_env / "hpkv.yaml", "cluster: from-cwd\n")
    assert load_settings().cluster == "from-cwd"
    other = _write(isolated_env / "other.yaml", "cluster: explicit\n")
    assert load_settings(config_path=str(other)).cluster == "explicit"
    assert load_settings(environ={"HPKV_CONFIG": str(other)}).cluster == "explicit"


@pytest.mark.parametrize(
    ("text", "message", "fix"),
    [
        ("clusterr: demo\n", "unknown key 'clusterr'", "did you mean 'cluster'?"),
        (
            "tieredStorage:\n  memoryPercnt: 20\n",
            "unknown key 'tieredStorage.memoryPercnt'",
            "tieredStorage.memoryPercent",
        ),
        (
            "tieredStorage:\n  memoryPercent: ten\n",
            "tieredStorage.memoryPercent is 'ten', expected integer",
            "20..100",
        ),
        ("tieredStorage:\n  memoryPercent: 10\n", "outside the valid range 20..100", "20..100"),
        ("region: 5\n", "region is 5, expected string", "us-west-2"),
        ("output: xml\n", "expected one of table, json, yaml", "table, json, yaml"),
        ("cluster: [a\n", "is not valid YAML at line", "indentation"),
        ("- a\n- b\n", "must be a YAML mapping, found list", "cluster:"),
    ],
)
def test_invalid_file_gives_one_line(isolated_env: Path, text: str, message: str, fix: str) -> None:
    _write(isolated_env / "hpkv.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_settings(environ={})
    line = info.value.one_line()
    assert "\n" not in line
    assert message in line
    assert fix in (info.value.fix or "")
    assert info.value.exit_code == 2


def test_invalid_env_names_the_variable(isolated_env: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(environ={"HPKV_TIERED_STORAGE__MEMORY_PERCENT": "abc"})
    assert "HPKV_TIERED_STORAGE__MEMORY_PERCENT is 'abc', expected integer" in info.value.one_line()
    with pytest.raises(ConfigError) as info:
        load_settings(environ={"HPKV_CLUSTR": "x"})
    assert "HPKV_CLUSTR" in info.value.one_line()


def test_missing_explicit_config_file(isolated_env: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(config_path="nope.yaml")
    assert "config file nope.yaml does not exist" in info.value.one_line()


def test_config_file_that_is_not_text(isolated_env: Path) -> None:
    (isolated_env / "hpkv.yaml").write_bytes(b"cluster: \xff\xfe\n")
    with pytest.raises(ConfigError) as info:
        load_settings(environ={})
    assert "is not UTF-8 text" in info.value.one_line()


def test_redact_hides_secret_looking_keys() -> None:
    data = {
        "cluster": "x",
        "huggingFace": {"tokenSecret": "hf_abc"},
        "password": "p",
        "items": [{"apiKey": "k"}],
    }
    redacted = redact(data)
    assert redacted["cluster"] == "x"
    assert redacted["huggingFace"]["tokenSecret"] == "<redacted>"
    assert redacted["password"] == "<redacted>"
    assert redacted["items"][0]["apiKey"] == "<redacted>"
