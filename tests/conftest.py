import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAST_TOML = """
[timing]
warmup = 1
repeats = 3
threads = 1
max_spread = 10.0
max_slowdown = 100.0
"""


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Device ceilings and other caches go to a per-session folder, never the user's home."""
    cache = tmp_path_factory.mktemp("forge-cache")
    old = os.environ.get("FORGE_CACHE_DIR")
    os.environ["FORGE_CACHE_DIR"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("FORGE_CACHE_DIR", None)
    else:
        os.environ["FORGE_CACHE_DIR"] = old


@pytest.fixture
def fast_config(tmp_path, monkeypatch):
    """Run in an empty folder with a forge.toml that keeps timing short."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "forge.toml").write_text(FAST_TOML)
    return tmp_path / "forge.toml"


@pytest.fixture(scope="session")
def fast_cfg():
    import tomllib

    from forge_tui.config import parse_config

    return parse_config(tomllib.loads(FAST_TOML))


@pytest.fixture(scope="session")
def decoder_workspace(tmp_path_factory):
    """A profiled tiny_decoder workspace shared by read-only tests."""
    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("ws")
    cfg = root / "forge.toml"
    cfg.write_text(FAST_TOML)
    ws, result = profile_into_workspace("example:tiny_decoder", root / "decoder", device="cpu", config_path=cfg)
    return ws


def python_exe() -> str:
    return sys.executable
