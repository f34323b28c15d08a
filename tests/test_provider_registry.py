"""Providers declared once: a ``ProviderSpec`` registered here, and edited nowhere else, is known to
the configuration, ``auto``, the factory, pricing and redaction; and reading the registry imports
no LLM SDK."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from forge_tui.agent import agent_parts, resolve
from forge_tui.agent.messages import AssistantMessage, ModelTurn
from forge_tui.agent.pricing import price_for
from forge_tui.agent.providers import Connection, ProviderSpec, ScriptedProvider, make_provider, register, unregister
from forge_tui.agent.providers.registry import BUILTIN, key_variables, names
from forge_tui.config import AgentConfig, parse_config
from forge_tui.errors import ConfigError
from forge_tui.redaction import find_secrets, redact

NAME = "fakellm"
VAR = "FAKELLM_API_KEY"
KEY = "wxyz12"
"""Six characters: hidden only as a provider's key (other variables named *_KEY need eight)."""
ENV = {VAR: KEY}


@pytest.fixture
def fake():
    """A provider declared as a module would declare it, registered for one test; what its factory
    was given, in order."""
    built: list[Connection] = []

    def factory(c: Connection) -> ScriptedProvider:
        built.append(c)
        return ScriptedProvider([ModelTurn(message=AssistantMessage(text="hi"))], model=c.model)

    register(ProviderSpec(name=NAME, key_env=VAR, default_model="fake-1", prices={"fake-1": (1.0, 2.0)}, factory=factory))
    try:
        yield built
    finally:
        unregister(NAME)


def test_a_registered_provider_is_usable_everywhere(fake):
    config = parse_config({"agent": {"provider": NAME}}, "my.toml")  # the configuration accepts its name
    cfg, provider, price, hide = agent_parts(config, ENV)  # what every use of the LLM builds first
    assert isinstance(provider, ScriptedProvider) and provider.model == "fake-1"  # its factory, its default model
    assert fake[0].api_key == KEY and KEY in fake[0].secrets  # the key from its variable, known as a secret
    assert (price.input, price.output) == (1.0, 2.0) and price == price_for(cfg)  # its list price
    assert VAR in key_variables()
    assert redact(f"key={KEY}", ENV) == "key=[redacted]" and hide(f"key={KEY}") == "key=[redacted]"
    assert find_secrets(f"key={KEY}", ENV) == [f"the value of ${VAR}"]  # the git wrapper refuses it


def test_auto_takes_a_registered_provider_when_only_its_key_is_set(fake):
    chosen, why = resolve(AgentConfig(), ENV)
    assert chosen is not None and chosen.provider == NAME and why == f"{VAR} is set"
    assert make_provider(AgentConfig(), ENV).model == "fake-1"
    chosen, _ = resolve(AgentConfig(), {**ENV, "ANTHROPIC_API_KEY": "sk-ant-" + "k" * 20})
    assert chosen is not None and chosen.provider == "anthropic"  # the built-ins come first
    with pytest.raises(ConfigError, match=f"no LLM API key in the environment .*{VAR}"):
        make_provider(AgentConfig(), {})
    with pytest.raises(ConfigError, match=f"the API key variable {VAR} is not set"):
        make_provider(AgentConfig(provider=NAME), {})


def test_without_its_registration_the_provider_is_unknown():
    with pytest.raises(ConfigError, match=f"my.toml: agent.provider: input should be 'auto', 'none', 'anthropic', "
                                          f"'openai' or 'openai-compatible' \\(got str '{NAME}'\\)"):
        parse_config({"agent": {"provider": NAME}}, "my.toml")
    assert names() == ("anthropic", "openai", "openai-compatible") and len(BUILTIN) == 3
    assert redact(f"key={KEY}", ENV) == f"key={KEY}"  # six characters of an ordinary *_KEY variable stay
    assert key_variables() == ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="price of model 'fake-1' is not known"):
        price_for(AgentConfig.model_construct(provider=NAME, model="fake-1"))


def test_names_are_registered_once(fake):
    for name in (NAME, "anthropic", "auto", "none", ""):
        with pytest.raises(ValueError, match="already registered|needs a name"):
            register(ProviderSpec(name=name, key_env="", default_model="m", prices={}, factory=lambda c: ScriptedProvider([])))


def test_reading_the_registry_imports_no_sdk():
    """Configuration, pricing and redaction read the registry; the SDK comes with the provider."""
    code = """if True:
        import json, sys
        from forge_tui.agent.pricing import price_for
        from forge_tui.agent.providers import make_provider
        from forge_tui.config import parse_config
        from forge_tui.redaction import redact
        sdks = lambda: sorted({m.split(".")[0] for m in sys.modules} & {"anthropic", "openai"})
        cfg = parse_config({"agent": {"provider": "anthropic"}}).agent
        price_for(cfg), redact("text", {"ANTHROPIC_API_KEY": "sk-ant-0123456789"})
        before = sdks()
        make_provider(cfg, {"ANTHROPIC_API_KEY": "sk-ant-0123456789"})
        print(json.dumps([before, sdks()]))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [[], ["anthropic"]]
