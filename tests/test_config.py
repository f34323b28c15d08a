import pytest

from forge_tui.config import ForgeConfig, discover_config, load_config_file, parse_config, to_toml
from forge_tui.errors import ConfigError


def test_defaults_and_values():
    cfg = parse_config({"timing": {"repeats": 7}, "profile": {"modules": False}})
    assert cfg.timing.repeats == 7
    assert cfg.profile.modules is False
    assert cfg.profile.ops is True  # untouched defaults stay


@pytest.mark.parametrize("data, expected", [
    ({"timing": {"repets": 5}}, "[timing] unknown key 'repets'"),
    ({"nosuch": {}}, "unknown key 'nosuch'"),
    ({"timing": {"repeats": "5"}}, "timing.repeats"),
    ({"profile": {"ops": 1}}, "profile.ops"),
    ({"timing": {"repeats": 0}}, "timing.repeats"),
    ({"evaluator": {"api_key": "abc"}}, "secrets are read from the environment only"),
])
def test_bad_keys_and_types_are_named(data, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(data, "my.toml")
    assert expected in str(err.value)
    assert str(err.value).startswith("my.toml")
    assert "\n" not in str(err.value)


def test_toml_roundtrip(tmp_path):
    cfg = parse_config({"timing": {"repeats": 9, "cold_l2": False}})
    path = tmp_path / "forge.toml"
    path.write_text(to_toml(cfg))
    assert load_config_file(path) == cfg


def test_invalid_toml_is_one_line(tmp_path):
    path = tmp_path / "forge.toml"
    path.write_text("[timing\nrepeats = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config_file(path)


def test_discovery_order(tmp_path, monkeypatch):
    explicit = tmp_path / "explicit.toml"
    explicit.write_text("[timing]\nrepeats = 1\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "forge.toml").write_text("[timing]\nrepeats = 3\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert discover_config(None, ws)[0].timing.repeats == 3  # only the workspace has one
    (cwd / "forge.toml").write_text("[timing]\nrepeats = 2\n")
    assert discover_config(None, ws)[0].timing.repeats == 2  # ./forge.toml beats the workspace's
    assert discover_config(explicit, ws)[0].timing.repeats == 1  # --config beats both
    (cwd / "forge.toml").unlink()
    cfg, source = discover_config(None, None)
    assert cfg == ForgeConfig() and source is None
