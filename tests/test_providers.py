"""The providers through the real anthropic and openai SDK clients, against a local fake server
(tests/fake_llm.py): wire formats both ways, retries, errors, keys, and the scripted provider."""

from __future__ import annotations

import json
import logging
import time
import traceback

import pytest
from fake_llm import FakeLLM, anthropic_message, error, openai_completion, stall

from forge_tui.agent.messages import (
    AssistantMessage,
    ModelTurn,
    ProviderError,
    ToolCall,
    ToolResult,
    ToolResultsMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from forge_tui.agent.providers import (
    NO_KEY,
    AnthropicProvider,
    OpenAIProvider,
    ScriptedProvider,
    anthropic_messages,
    find,
    make_provider,
    redact,
)
from forge_tui.config import AgentConfig
from forge_tui.errors import ConfigError

KEY = "sk-test-0123456789abcdef"
ENV = {"LLM_KEY": KEY}
SYSTEM = "You write CUDA kernels."
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOL = ToolSpec(name="read_file", description="Read a file of the workspace.", parameters=SCHEMA)
SOURCE = "__global__ void k() {}"
MODEL = {"anthropic": "claude-test", "openai": "gpt-test", "openai-compatible": "qwen-test"}


def provider(fake: FakeLLM, kind: str, **cfg: object) -> AnthropicProvider | OpenAIProvider:
    base_url = fake.base_url if kind == "anthropic" else fake.openai_base_url
    fields: dict[str, object] = {"provider": kind, "model": MODEL[kind], "base_url": base_url, "api_key_env": "LLM_KEY",
                                 "retries": 2, "request_timeout_s": 5.0, **cfg}
    p = make_provider(AgentConfig(**fields), ENV)  # type: ignore[arg-type]
    assert isinstance(p, (AnthropicProvider, OpenAIProvider))
    return p


def ok(kind: str, text: str = "done"):
    return anthropic_message(text) if kind == "anthropic" else openai_completion(text)


def first_turn_and_reply(p, kind):
    """Ask, get a tool call, send its result with a harness note: the second query's messages."""
    user = UserMessage(text="Write a softmax kernel.")
    turn = p.query(SYSTEM, [user], [TOOL], 1000)
    results = ToolResultsMessage(results=[ToolResult(call_id=turn.message.tool_calls[0].id, name="read_file",
                                                     content=SOURCE)], text="39 tool calls left")
    return turn, [user, turn.message, results]


# -- round trips --------------------------------------------------------------------------------


def test_anthropic_round_trip():
    with FakeLLM() as fake:
        fake.reply(anthropic_message("Let me look.", [("toolu_01", "read_file", {"path": "k.cu"})],
                                     input_tokens=100, output_tokens=20, cache_read=50, cache_write=10),
                   anthropic_message("Here it is."))
        p = provider(fake, "anthropic")
        turn, messages = first_turn_and_reply(p, "anthropic")
        final = p.query(SYSTEM, messages, [TOOL], 2000)

    assert turn.message == AssistantMessage(text="Let me look.", tool_calls=[
        ToolCall(id="toolu_01", name="read_file", arguments={"path": "k.cu"}, raw_arguments='{"path": "k.cu"}')])
    assert turn.stop_reason == "tool_use" and turn.model == "claude-test"
    assert turn.usage == Usage(input_tokens=100, output_tokens=20, cache_read_tokens=50, cache_write_tokens=10)
    assert turn.request_id and turn.request_id.startswith("req_")
    assert final.message == AssistantMessage(text="Here it is.") and final.stop_reason == "end_turn"

    first, second = fake.requests
    assert first.path == second.path == "/v1/messages"
    # prompt caching: a breakpoint after the system prompt (tools and system cached) and one on
    # the newest block of the conversation (everything sent before is read from the cache next time)
    cached = {"type": "ephemeral"}
    assert first.body == {"model": "claude-test", "max_tokens": 1000,
                          "system": [{"type": "text", "text": SYSTEM, "cache_control": cached}],
                          "tools": [{"name": "read_file", "description": TOOL.description, "input_schema": SCHEMA}],
                          "messages": [{"role": "user", "content": [{"type": "text", "text": "Write a softmax kernel.",
                                                                     "cache_control": cached}]}]}
    assert second.body["max_tokens"] == 2000
    assert second.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Write a softmax kernel."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_01", "name": "read_file",
                                           "input": {"path": "k.cu"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": SOURCE,
                                      "is_error": False},
                                     {"type": "text", "text": "39 tool calls left", "cache_control": cached}]},
    ]
    # anthropic 2.14 sends the API key as a bearer token (no x-api-key header)
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert "anthropic-version" in first.headers


@pytest.mark.parametrize("kind,limit_field", [("openai", "max_completion_tokens"), ("openai-compatible", "max_tokens")])
def test_openai_round_trip(kind, limit_field):
    with FakeLLM() as fake:
        fake.reply(openai_completion(None, [("call_abc", "read_file", {"path": "k.cu"})],
                                     prompt_tokens=100, completion_tokens=20, cached_tokens=40),
                   openai_completion("Here it is."))
        p = provider(fake, kind)
        turn, messages = first_turn_and_reply(p, kind)
        final = p.query(SYSTEM, messages, [TOOL], 2000)

    assert p.name == kind
    assert turn.message == AssistantMessage(tool_calls=[
        ToolCall(id="call_abc", name="read_file", arguments={"path": "k.cu"}, raw_arguments='{"path": "k.cu"}')])
    assert turn.stop_reason == "tool_calls" and turn.model == "gpt-test"
    assert turn.usage == Usage(input_tokens=60, output_tokens=20, cache_read_tokens=40)
    assert turn.request_id and turn.request_id.startswith("req_")
    assert final.message == AssistantMessage(text="Here it is.") and final.stop_reason == "stop"

    first, second = fake.requests
    assert first.path == second.path == "/v1/chat/completions"
    assert first.body == {"model": MODEL[kind], limit_field: 1000,
                          "tools": [{"type": "function", "function": {"name": "read_file", "description": TOOL.description,
                                                                      "parameters": SCHEMA}}],
                          "messages": [{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": "Write a softmax kernel."}]}
    assert second.body[limit_field] == 2000
    assert second.body["messages"][1:] == [
        {"role": "user", "content": "Write a softmax kernel."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "k.cu"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": SOURCE},
        {"role": "user", "content": "39 tool calls left"},
    ]
    assert first.headers["authorization"] == f"Bearer {KEY}"


def test_anthropic_messages_alternate_roles():
    """Tool results followed by a user message become one user message (tool_result blocks first),
    and an empty assistant message is left out."""
    call = ToolCall(id="t1", name="read_file", arguments={"path": "a"})
    wire = anthropic_messages([
        UserMessage(text="go"), AssistantMessage(tool_calls=[call]),
        ToolResultsMessage(results=[ToolResult(call_id="t1", name="read_file", content="x", is_error=True)]),
        UserMessage(text="hurry"), AssistantMessage(), UserMessage(text="well?"),
    ])
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert wire[2]["content"] == [{"type": "tool_result", "tool_use_id": "t1", "content": "x", "is_error": True},
                                  {"type": "text", "text": "hurry"}, {"type": "text", "text": "well?"}]


# -- retries and errors -------------------------------------------------------------------------

KINDS = ["anthropic", "openai"]


@pytest.mark.parametrize("kind", KINDS)
def test_rate_limit_is_retried_after_the_servers_delay(kind):
    with FakeLLM() as fake:
        fake.reply(error(429, "slow down", retry_after_ms=1), ok(kind))
        turn = provider(fake, kind).query(SYSTEM, [UserMessage(text="hi")], [], 100)
    assert turn.message.text == "done"
    first, retry = fake.requests
    assert retry.headers["x-stainless-retry-count"] == "1"
    assert retry.at - first.at < 0.3  # retry-after-ms was honoured (the SDKs' own first backoff is 0.375-0.5 s)


@pytest.mark.parametrize("kind", KINDS)
def test_server_errors_past_the_retries_are_retryable(kind):
    with FakeLLM() as fake:
        fake.reply(error(500, "internal", retry_after_ms=1), error(503, "unavailable", retry_after_ms=1),
                   error(529, "Overloaded", retry_after_ms=1), ok(kind))
        with pytest.raises(ProviderError) as info:
            provider(fake, kind, retries=2).query(SYSTEM, [UserMessage(text="hi")], [], 100)
    err = info.value
    assert len(fake.requests) == 3
    assert err.retryable and err.status == 529
    assert str(err) == f"{kind}: HTTP 529 after 2 retries: Overloaded"


@pytest.mark.parametrize("kind", KINDS)
def test_401_is_final_and_never_shows_the_key(kind):
    """The server echoes the key in its message (some do): it is redacted from the error."""
    with FakeLLM() as fake:
        fake.reply(error(401, f"invalid x-api-key: {KEY}"), ok(kind))
        with pytest.raises(ProviderError) as info:
            provider(fake, kind).query(SYSTEM, [UserMessage(text="hi")], [], 100)
    err = info.value
    assert len(fake.requests) == 1
    assert not err.retryable and err.status == 401
    assert str(err) == f"{kind}: HTTP 401: invalid x-api-key: [redacted]"
    assert KEY not in "".join(traceback.format_exception(err)) + repr(err)


def test_a_long_message_is_cut_after_the_key_is_hidden():
    """A key that straddles the 300-character cut still does not leak a prefix of itself."""
    with FakeLLM() as fake:
        fake.reply(error(400, "x" * 270 + KEY + "y" * 100))  # the cut falls inside the key
        with pytest.raises(ProviderError) as info:
            provider(fake, "anthropic").query(SYSTEM, [UserMessage(text="hi")], [], 100)
    text = str(info.value)
    assert len(text) == 300 and text.endswith("[redac...")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [400, 404])
def test_client_errors_are_not_retried(kind, status):
    with FakeLLM() as fake:
        fake.reply(error(status, "model: claude-nonexistent"), ok(kind))
        with pytest.raises(ProviderError) as info:
            provider(fake, kind).query(SYSTEM, [UserMessage(text="hi")], [], 100)
    assert len(fake.requests) == 1
    assert not info.value.retryable and info.value.status == status
    assert "claude-nonexistent" in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_a_stall_past_the_timeout_is_retried_then_retryable(kind):
    stall_s = 60.0  # far past the timeout and any machine's slowness: only a wait for the stall takes it
    with FakeLLM() as fake:
        fake.reply(stall(stall_s), stall(stall_s))
        start = time.monotonic()
        with pytest.raises(ProviderError) as info:
            provider(fake, kind, request_timeout_s=0.1, retries=1).query(SYSTEM, [UserMessage(text="hi")], [], 100)
        elapsed = time.monotonic() - start
    assert len(fake.requests) == 2
    assert info.value.retryable and info.value.status is None
    assert str(info.value) == f"{kind}: no reply within 0.1 s after 1 retry"
    assert elapsed < stall_s  # the client gave up on the first stall rather than waiting it out


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_connection_is_retryable(kind):
    with FakeLLM() as fake:
        url = fake.base_url  # nothing listens there once the server stops
    p = make_provider(AgentConfig(provider=kind, model="m", base_url=url, api_key_env="LLM_KEY", retries=0), ENV)
    with pytest.raises(ProviderError) as info:
        p.query(SYSTEM, [UserMessage(text="hi")], [], 100)
    assert info.value.retryable and f"cannot reach {url}" in str(info.value)


# -- what compatible servers send ---------------------------------------------------------------


def test_malformed_arguments_and_missing_usage_from_a_compatible_server():
    with FakeLLM() as fake:
        fake.reply(openai_completion("", [("c1", "read_file", '{"path": "k.cu"'), ("c2", "read_file", "[1, 2]"),
                                          ("c3", "list_files", ""), ("c4", "read_file", '{"path": "ok.cu"}')],
                                     prompt_tokens=None),
                   openai_completion("thanks"))
        p = provider(fake, "openai-compatible")
        turn = p.query(SYSTEM, [UserMessage(text="hi")], [TOOL], 100)
        p.query(SYSTEM, [UserMessage(text="hi"), turn.message], [TOOL], 100)

    bad_json, not_object, empty, good = turn.message.tool_calls
    assert bad_json.raw_arguments == '{"path": "k.cu"' and "not valid JSON" in (bad_json.arguments_error or "")
    assert not_object.arguments == {} and "not a JSON object (got list)" in (not_object.arguments_error or "")
    assert empty.arguments == {} and empty.arguments_error is None
    assert good.arguments == {"path": "ok.cu"} and good.arguments_error is None
    assert turn.usage == Usage()
    sent = fake.requests[1].body["messages"][-1]["tool_calls"]
    assert [c["function"]["arguments"] for c in sent] == ["{}", "{}", "{}", '{"path": "ok.cu"}']


# -- configuration and keys ---------------------------------------------------------------------


@pytest.mark.parametrize("kind,var", [("anthropic", "ANTHROPIC_API_KEY"), ("openai", "OPENAI_API_KEY")])
def test_a_missing_key_names_its_variable(kind, var):
    with pytest.raises(ConfigError, match=var):
        make_provider(AgentConfig(provider=kind), {})
    with pytest.raises(ConfigError, match="MY_LLM_KEY"):
        make_provider(AgentConfig(provider=kind, api_key_env="MY_LLM_KEY"), {var: KEY})


def test_config_errors():
    with pytest.raises(ConfigError, match="base_url"):
        make_provider(AgentConfig(provider="openai-compatible", model="qwen"), {})
    with pytest.raises(ConfigError, match="model"):
        make_provider(AgentConfig(provider="openai-compatible", base_url="http://localhost:8000/v1"), {})
    with pytest.raises(ConfigError, match='provider is "none"'):
        make_provider(AgentConfig(provider="none"), {"ANTHROPIC_API_KEY": KEY})
    with pytest.raises(ConfigError, match="no LLM API key"):
        make_provider(AgentConfig(provider="auto"), ENV)


def test_auto_picks_the_provider_whose_key_is_set():
    both = make_provider(AgentConfig(), {"ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": KEY + "o"})
    assert both.name == "anthropic" and both.model == find("anthropic").default_model
    only_openai = make_provider(AgentConfig(), {"OPENAI_API_KEY": KEY})
    assert only_openai.name == "openai" and only_openai.model == find("openai").default_model


def test_default_model_and_key_variable():
    p = make_provider(AgentConfig(provider="anthropic"), {"ANTHROPIC_API_KEY": KEY})
    assert p.model == find("anthropic").default_model and p.name == "anthropic"
    assert KEY not in repr(p)


def test_a_compatible_server_gets_no_key_unless_named():
    """OPENAI_API_KEY is not sent to some other server: without api_key_env, a placeholder."""
    with FakeLLM() as fake:
        fake.reply(openai_completion("hi"))
        cfg = AgentConfig(provider="openai-compatible", model="qwen", base_url=fake.openai_base_url)
        make_provider(cfg, {"OPENAI_API_KEY": KEY}).query(SYSTEM, [UserMessage(text="hi")], [], 100)
    assert fake.requests[0].headers["authorization"] == f"Bearer {NO_KEY}"


@pytest.mark.parametrize("kind", KINDS)
def test_the_sdks_debug_log_never_holds_the_key(kind, caplog):
    for name in ("anthropic", "openai", "httpx2", "httpcore"):
        caplog.set_level(logging.DEBUG, logger=name)
    with FakeLLM() as fake:
        fake.reply(error(500, "x", retry_after_ms=1), ok(kind))
        provider(fake, kind).query(SYSTEM, [UserMessage(text="hi")], [], 100)
    assert "Retrying" in caplog.text  # the SDK did log at debug level
    assert KEY not in caplog.text


def test_redact():
    environ = {"ANTHROPIC_API_KEY": "sk-ant-api03-abcdef", "MY_LLM": "short-ok", "GITHUB_TOKEN": "ghp_0123456789",
               "AWS_SECRET": "wJalrXUtnFEMI", "TINY_KEY": "abc1234", "HOME": "/home/someone-long"}
    text = "sk-ant-api03-abcdef short-ok ghp_0123456789 wJalrXUtnFEMI abc1234 /home/someone-long"
    assert redact(text, environ, ["MY_LLM"]) == "[redacted] [redacted] [redacted] [redacted] abc1234 /home/someone-long"
    assert "short-ok" in redact(text, environ)  # a variable not named as a key and not called *_KEY stays


# -- the scripted provider ----------------------------------------------------------------------


def test_scripted_provider_replays_and_records():
    first = ModelTurn(message=AssistantMessage(text="one"), stop_reason="end_turn", usage=Usage(input_tokens=3))
    second = ModelTurn(message=AssistantMessage(tool_calls=[ToolCall(id="a", name="read_file")]))
    p = ScriptedProvider([first, ProviderError("overloaded", retryable=True, status=529), second])
    assert p.query("sys", [UserMessage(text="hi")], [TOOL], 10) == first
    with pytest.raises(ProviderError, match="overloaded") as info:
        p.query("sys", [], [], 20)
    assert info.value.retryable and info.value.status == 529
    assert p.query("sys", [], [], 30) == second
    with pytest.raises(ProviderError, match="no more turns") as info:
        p.query("sys", [], [], 40)
    assert not info.value.retryable
    assert [c.max_tokens for c in p.calls] == [10, 20, 30, 40]
    assert p.calls[0].messages == [UserMessage(text="hi")] and p.calls[0].tools == [TOOL] and p.calls[0].system == "sys"


def test_scripted_provider_from_file(tmp_path):
    turn = ModelTurn(message=AssistantMessage(text="hi"), stop_reason="end_turn")
    path = tmp_path / "script.json"
    path.write_text(json.dumps([turn.model_dump(), {"error": "rate limited", "retryable": True, "status": 429}]))
    p = ScriptedProvider.from_file(path)
    assert p.query("", [], [], 1) == turn
    with pytest.raises(ProviderError, match="rate limited") as info:
        p.query("", [], [], 1)
    assert info.value.retryable and info.value.status == 429
    path.write_text('{"not": "a list"}')
    with pytest.raises(ConfigError, match="script.json"):
        ScriptedProvider.from_file(path)
