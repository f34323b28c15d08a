"""The LLM agent without a network: scripted conversations through the real loop, the real tools
and (for the end-to-end tests) the real CPU evaluator and git store."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from forge_tui.agent.loop import Agent, Limits, input_bound
from forge_tui.agent.messages import AssistantMessage, ModelTurn, ProviderError, ToolCall, ToolResult, ToolSpec, Usage
from forge_tui.agent.pricing import Price, price_for
from forge_tui.agent.providers import ScriptedProvider
from forge_tui.agent.transcript import Transcript, read_entries
from forge_tui.config import AgentConfig, parse_config
from forge_tui.errors import ConfigError
from forge_tui.search.events import AgentStep, NodeAdded, ProposerFailed, Recorder
from forge_tui.search.ledger import Ledger, LimitReached

PRICE = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
TOOL = ToolSpec(name="echo", description="echo", parameters={"type": "object", "properties": {}})


def turn(*calls: tuple[str, dict], text: str = "", inp: int = 3000, out: int = 400, stop: str = "tool_use") -> ModelTurn:
    tcs = [ToolCall(id=f"call_{i}_{name}", name=name, arguments=args) for i, (name, args) in enumerate(calls)]
    return ModelTurn(message=AssistantMessage(text=text, tool_calls=tcs), stop_reason=stop,
                     usage=Usage(input_tokens=inp, output_tokens=out), model="scripted")


class Echo:
    """Tools for loop tests: every call succeeds; 'submit' ends the conversation."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.done = False

    def __call__(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        if call.name == "submit":
            self.done = True
        return ToolResult(call_id=call.id, name=call.name, content=f"ran {call.name}")


def make_agent(provider, tmp_path, *, limits=None, ledger=None, price=PRICE, redact=lambda s: s, steps=None):
    tools = Echo()
    agent = Agent(provider, price, [TOOL], execute=tools, submitted=lambda: tools.done, limits=limits or Limits(),
                  ledger=ledger or Ledger(0.0), card="card", transcript=Transcript(tmp_path / "t.jsonl", redact),
                  on_step=steps.append if steps is not None else None)
    return agent, tools


# ---- the loop ------------------------------------------------------------------------------------

def test_loop_runs_tools_until_submit_and_accounts_every_query(tmp_path):
    prov = ScriptedProvider([turn(("echo", {})), turn(("echo", {}), ("echo", {})), turn(("submit", {}))])
    steps: list = []
    agent, tools = make_agent(prov, tmp_path, steps=steps)
    out = agent.run("system", "task")
    assert out.submitted and out.reason == "submitted"
    assert [c.name for c in tools.calls] == ["echo", "echo", "echo", "submit"]
    assert out.queries == 3 and out.tool_calls == 4
    assert out.usage.input_tokens == 9000 and out.usage.output_tokens == 1200
    assert out.cost_usd == pytest.approx(3 * (3000 * 3 + 400 * 15) / 1e6)
    # the observations go back in order, each tool result answering its call
    second = prov.calls[2].messages
    assert [r.call_id for r in second[-1].results] == ["call_0_echo", "call_1_echo"]
    assert [s["step"] for s in steps] == [1, 2, 3] and steps[1]["tools"] == ["echo", "echo"]
    assert steps[0]["cost_usd"] == pytest.approx((3000 * 3 + 400 * 15) / 1e6)


def test_format_errors_and_unanswered_turns_go_back_to_the_model(tmp_path):
    prov = ScriptedProvider([turn(text="thinking", stop="end_turn"), turn(("submit", {}))])
    agent, _ = make_agent(prov, tmp_path)
    out = agent.run("s", "t")
    assert out.submitted
    nudge = prov.calls[1].messages[-1]
    assert nudge.role == "user" and "did not call a tool" in nudge.text


def test_a_model_that_never_calls_tools_is_stopped(tmp_path):
    prov = ScriptedProvider([turn(text="hm", stop="end_turn")] * 10)
    agent, _ = make_agent(prov, tmp_path)
    out = agent.run("s", "t")
    assert not out.submitted and "without calling a tool" in out.reason and out.queries == 4


def test_tool_call_limit_ends_the_conversation_cleanly(tmp_path):
    prov = ScriptedProvider([turn(("echo", {}), ("echo", {}))] * 5)
    agent, tools = make_agent(prov, tmp_path, limits=Limits(tool_calls=3))
    out = agent.run("s", "t")
    assert not out.submitted and out.reason.startswith("tool-call limit reached (3 of 3)")
    assert len(tools.calls) == 3 and out.queries == 2
    # the model was warned before the end, and the call beyond the limit was answered, not run
    last = prov.calls[-1].messages[-1]
    assert "tool call" in last.text and "left" in last.text
    assert agent.messages[-1].results[-1].is_error and "limit" in agent.messages[-1].results[-1].content


def test_token_limit_is_never_passed(tmp_path):
    prov = ScriptedProvider([turn(("echo", {}), inp=5000, out=1000)] * 20)
    limits = Limits(tokens=40_000, output_tokens=4096)
    agent, _ = make_agent(prov, tmp_path, limits=limits)
    out = agent.run("s", "t")
    assert out.reason.startswith("token limit reached")
    assert out.usage.total <= limits.tokens
    # every query was allowed only what was left
    for call in prov.calls:
        assert call.max_tokens <= limits.output_tokens


def test_wall_time_limit(tmp_path):
    now = [0.0]

    class Slow(ScriptedProvider):
        def query(self, *a):
            now[0] += 4.0  # every answer takes 4 s
            return super().query(*a)

    prov = Slow([turn(("echo", {}))] * 5)
    tools = Echo()
    agent = Agent(prov, PRICE, [TOOL], execute=tools, submitted=lambda: tools.done, limits=Limits(wall_s=10.0),
                  ledger=Ledger(0.0), card="c", transcript=Transcript(None), clock=lambda: now[0])
    out = agent.run("s", "t")
    assert out.reason == "wall-time limit reached (12 s of 10 s)" and out.queries == 3


def test_money_cap_of_the_conversation_is_never_passed(tmp_path):
    prov = ScriptedProvider([turn(("echo", {}), inp=3000, out=400)] * 50)
    cap = 0.1
    agent, _ = make_agent(prov, tmp_path, limits=Limits(cost_usd=cap, output_tokens=1024))
    out = agent.run("s", "t")
    assert out.reason.startswith("money limit reached") and "conversation's money cap" in out.reason
    assert 0 < out.cost_usd <= cap
    # before each query, its worst case fitted in what was left
    spent = 0.0
    for k, call in enumerate(prov.calls):
        worst = PRICE.worst_case(input_bound(call.system, call.messages, call.tools), call.max_tokens)
        assert spent + worst <= cap + 1e-12
        spent += PRICE.cost(prov.turns[k].usage)


def test_run_cap_below_one_query_makes_no_call(tmp_path):
    prov = ScriptedProvider([turn(("submit", {}))])
    ledger = Ledger(run_cap_usd=0.001)
    agent, _ = make_agent(prov, tmp_path, ledger=ledger)
    out = agent.run("s", "t")
    assert prov.calls == [] and out.queries == 0 and out.cost_usd == 0
    assert "the run's money cap ($0.00)" in out.reason or "run's money cap" in out.reason
    assert ledger.spent == 0


def test_ledger_caps_hold_with_conversations_in_flight():
    ledger = Ledger(run_cap_usd=1.0, card_cap_usd=0.6)
    a = ledger.reserve("A", 0.5)
    with pytest.raises(LimitReached, match="card's money cap"):
        ledger.reserve("A", 0.2)  # 0.5 reserved + 0.2 > 0.6
    b = ledger.reserve("B", 0.5)
    with pytest.raises(LimitReached, match="run's money cap"):
        ledger.reserve("C", 0.01)
    ledger.settle(a, 0.1)  # used less than reserved: the rest goes back
    assert ledger.spent == pytest.approx(0.1) and ledger.headroom("A") == pytest.approx(0.4)
    ledger.settle(b, 0.2)
    assert ledger.spent == pytest.approx(0.3) and ledger.spent_on("B") == pytest.approx(0.2)
    ledger.reserve("C", 0.6)


def test_provider_failure_ends_the_conversation_with_the_reason(tmp_path):
    prov = ScriptedProvider([turn(("echo", {})), ProviderError("anthropic: 529 overloaded", retryable=True, status=529)])
    ledger = Ledger(5.0)
    agent, _ = make_agent(prov, tmp_path, ledger=ledger)
    out = agent.run("s", "t")
    assert out.provider_failed and out.provider_status == 529 and "529 overloaded" in out.reason
    # the failed query's reservation went back; the one that succeeded is spent
    assert ledger.spent == pytest.approx(PRICE.cost(prov.turns[0].usage)) and ledger.headroom("card") == pytest.approx(
        5.0 - ledger.spent)


def test_transcript_is_on_disk_after_every_step_and_holds_no_secret(tmp_path, monkeypatch):
    secret = "sk-ant-" + "x" * 40
    seen: list[list[dict]] = []

    class Watching(ScriptedProvider):
        def query(self, system, messages, tools, max_tokens):
            seen.append(read_entries(tmp_path / "t.jsonl"))  # what a crash right now would leave
            return super().query(system, messages, tools, max_tokens)

    prov = Watching([turn(("echo", {}), text=f"my key is {secret}"), turn(("echo", {})), turn(("submit", {}))])
    agent, _ = make_agent(prov, tmp_path, redact=lambda s: s.replace(secret, "[redacted]"))
    agent.run("s", "t")
    # before the 3rd query, the 2nd step's tool results were already on disk
    assert any(e["type"] == "message" and e["message"]["role"] == "tool" and e["step"] == 2 for e in seen[2])
    assert [e["type"] for e in seen[1]].count("query") == 1
    text = (tmp_path / "t.jsonl").read_text()
    assert secret not in text and "[redacted]" in text
    entries = read_entries(tmp_path / "t.jsonl")
    assert entries[-1]["type"] == "end" and entries[-1]["submitted"] is True
    assert sum(e["cost_usd"] for e in entries if e["type"] == "query") == pytest.approx(agent.cost)


def test_a_transcript_line_cut_by_a_crash_is_left_out(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"type": "query", "cost_usd": 0.5}) + "\n" + '{"type": "mess')
    assert read_entries(p) == [{"type": "query", "cost_usd": 0.5}]


# ---- prices --------------------------------------------------------------------------------------

def test_prices_come_from_the_config_or_the_table_and_unknown_models_refuse():
    assert price_for(AgentConfig(provider="anthropic", model="claude-sonnet-4-5-20250929")).output == 15.0
    p = price_for(AgentConfig(provider="anthropic", model="claude-sonnet-4-5", input_usd_per_mtok=2.0))
    assert p.input == 2.0 and p.output == 15.0 and p.cache_read == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="price of model 'my-local-model' is not known"):
        price_for(AgentConfig(provider="openai-compatible", model="my-local-model", base_url="http://x"))
    free = price_for(AgentConfig(provider="openai-compatible", model="m", input_usd_per_mtok=0.0, output_usd_per_mtok=0.0))
    assert free.cost(Usage(input_tokens=10**6, output_tokens=10**6)) == 0
    assert price_for(AgentConfig(provider="openai")).input == 1.25  # the provider's default model, its list price


def test_a_vendor_api_finds_another_vendors_list_price():
    """A proxy on OpenAI's API may serve Claude: a provider with list prices looks in the others'
    lists too; a compatible server (no list) never takes a listed price."""
    assert price_for(AgentConfig(provider="openai", model="claude-opus-4-1-20250805")).output == 75.0
    assert price_for(AgentConfig(provider="anthropic", model="gpt-4.1-mini")).input == 0.4
    with pytest.raises(ConfigError, match="price of model 'claude-opus-4-1' is not known"):
        price_for(AgentConfig(provider="openai-compatible", model="claude-opus-4-1", base_url="http://x"))


# ---- end to end: the agent in the search, on the CPU evaluator ------------------------------------

BROKEN = """// naive softmax over the last dim
#include <cmath>
#include "forge_kernel.h"

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {
    const forge_tensor* x = &in[0];
    const int64_t cols = x->shape[x->ndim - 1];
    const int64_t rows = forge_numel(x) / cols;
    const float* src = (const float*)x->data;
    float* dst = (float*)out[0].data;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = src + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = a[c] > m ? a[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += std::exp((double)a[c] - m);
        for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = (float)(std::exp((double)a[c] - m) / s);
    }
    return 0
}
"""
FIXED = BROKEN.replace("    return 0\n}", "    return 0;\n}")
FASTER = (FIXED.replace("    for (int64_t r = 0; r < rows; ++r) {", "#pragma omp parallel for\n    for (int64_t r = 0; r < rows; ++r) {")
          .replace("// naive softmax", "// softmax, rows in parallel,"))


def softmax_conversation() -> list[ModelTurn]:
    return [
        turn(("read_file", {"path": "card.json"}), ("read_file", {"path": "reference.py"}), text="Reading the card."),
        turn(("write_file", {"path": "candidate.cpp", "content": BROKEN}), ("compile", {})),
        turn(("edit_file", {"path": "candidate.cpp", "old": "    return 0\n}", "new": "    return 0;\n}"}), ("compile", {})),
        turn(("run_tests", {}),),
        turn(("profile", {}),),
        turn(("write_file", {"path": "candidate.cpp", "content": FASTER}), ("run_tests", {}), ("profile", {})),
        turn(("submit", {"move": "rows in parallel with OpenMP"}),),
    ]


AGENT_CFG = {"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0, "max_slowdown": 100.0},
             "evaluator": {"run_timeout_s": 20.0},
             "search": {"max_evals": 1, "evals_per_card": 1, "parallel": 1},
             "agent": {"provider": "anthropic", "model": "claude-sonnet-4-5", "input_usd_per_mtok": 3.0,
                       "output_usd_per_mtok": 15.0}}


@pytest.fixture(scope="module")
def softmax_ws(tmp_path_factory):
    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("agentws")
    (root / "forge.toml").write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\n")
    ws, _ = profile_into_workspace("example:kb_softmax", root / "ws", device="cpu", config_path=root / "forge.toml")
    return ws


def run_search(ws, cfg, proposer, *, resume=False, fresh=False):
    from forge_tui.search.pool import LocalEvalPool
    from forge_tui.search.runner import Search
    from forge_tui.search.store import SearchStore

    if fresh:
        with ws.git() as repo:
            SearchStore(repo).delete_all()
    rec = Recorder()
    pool = LocalEvalPool(ws.store, ws.cache, cfg, backend="cpu")
    try:
        search = Search(ws, cfg, proposer, pool, cards=["_softmax"])
        search.bus.subscribe(rec)
        summary = search.run(resume=resume)
    finally:
        pool.close()
    return summary, rec, search


def git(ws, *args) -> str:
    return subprocess.run(["git", "-C", str(ws.root), *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_agent_conversation_end_to_end_on_the_cpu_evaluator(softmax_ws):
    from forge_tui.agent import build_agent
    from forge_tui.templates.proposer import TemplateProposer

    cfg = parse_config(AGENT_CFG)
    prov = ScriptedProvider(softmax_conversation())
    agent = build_agent(cfg, softmax_ws.root, provider=prov, environ={}, template=TemplateProposer())
    summary, rec, search = run_search(softmax_ws, cfg, agent, fresh=True)

    # what the model was told: the rules the judge enforces, the card, the reference, the machine,
    # the lineage, and the template library's kernel for the card
    first = prov.calls[0]
    assert "Every element of every output must be written" in first.system and "candidate.cpp" in first.system
    task = first.messages[0].text
    for piece in ("Card `_softmax", "shape [16, 512] stride [512, 1] (contiguous)", "aten._softmax.default",
                  "backend cpu", "measured copy bandwidth", "no kernel has passed yet", "template.cpp",
                  "forge_kernel.h (read-only)"):
        assert piece in task, piece
    assert {t.name for t in first.tools} == {"read_file", "write_file", "edit_file", "list_files", "compile",
                                              "run_tests", "profile", "submit"}

    assert summary.evaluations == 1 and len(prov.calls) == 7
    node = next(e for e in rec.events if isinstance(e, NodeAdded) and not e.is_root)
    assert node.status == "passed", node.reason
    assert node.proposer == "agent" and node.move == "agent: rows in parallel with OpenMP"
    expected_cost = 7 * (3000 * 3.0 + 400 * 15.0) / 1e6
    assert node.cost_usd == pytest.approx(expected_cost) and summary.cost_usd == pytest.approx(expected_cost)

    # the transcript is on the node's branch: the compile error with its line, the fix, the tests,
    # the profiles, the submission, and the cost of every query
    branch = f"search/{node.card}/{node.node}"
    transcript = json.loads(git(softmax_ws, "show", f"{branch}:candidate/transcript.json"))
    results = [r for e in transcript if e["type"] == "message" and e["message"]["role"] == "tool"
               for r in e["message"]["results"]]
    by_tool = {}
    for r in results:
        by_tool.setdefault(r["name"], []).append(r)
    first_compile, second_compile = by_tool["compile"]
    assert "error" in first_compile["content"] and ":20:" in first_compile["content"], first_compile["content"]
    assert not second_compile["is_error"] and "error" not in second_compile["content"].split("\n")[0].lower()
    assert all("FAIL" not in r["content"] for r in by_tool["run_tests"]) and len(by_tool["run_tests"]) == 2
    assert all("profiler unavailable" in r["content"] for r in by_tool["profile"]) and len(by_tool["profile"]) == 2
    assert sum(e["cost_usd"] for e in transcript if e["type"] == "query") == pytest.approx(expected_cost)
    assert transcript[-1]["type"] == "end" and transcript[-1]["submitted"]
    assert git(softmax_ws, "show", f"{branch}:candidate/candidate.cpp") == FASTER
    assert f"Forge-Conversation: {transcript[0]['conversation']}" in git(softmax_ws, "log", "-1", "--format=%B", branch)

    # money per call, conversation, card and run in the events
    steps = [e for e in rec.events if isinstance(e, AgentStep)]
    assert len(steps) == 7 and steps[-1].conversation_cost_usd == pytest.approx(expected_cost)
    assert steps[-1].run_cost_usd == pytest.approx(expected_cost) and steps[-1].card_cost_usd == pytest.approx(expected_cost)
    assert steps[1].summary.startswith("write_file") and "compile" in steps[1].summary
    # the working directory went once the node was committed
    assert not any((softmax_ws.root / ".forge" / "agent").iterdir())

    # a second run with a money cap below one query's price makes no call
    cheap = parse_config({**AGENT_CFG, "search": {**AGENT_CFG["search"], "max_cost_usd": 0.01}})
    prov2 = ScriptedProvider(softmax_conversation())
    agent2 = build_agent(cheap, softmax_ws.root, provider=prov2, environ={})
    summary2, rec2, _ = run_search(softmax_ws, cheap, agent2, fresh=True)
    assert prov2.calls == [] and summary2.evaluations == 0 and summary2.cost_usd == 0
    failed = next(e for e in rec2.events if isinstance(e, ProposerFailed))
    assert "money limit reached" in failed.reason and "run's money cap ($0.01)" in failed.reason and failed.stopped
    assert "the LLM agent stopped" in summary2.finished[node.card]


def test_a_conversation_killed_midway_is_committed_by_the_next_run(tmp_path):
    from search_helpers import FakePool, make_workspace, synthetic_card

    from forge_tui.agent import build_agent
    from forge_tui.search.runner import Search
    from forge_tui.search.store import SearchStore

    ws = make_workspace(tmp_path / "ws", [synthetic_card("_softmax-aa", 0.5, 10.0, 1.0)])
    cfg = parse_config({"search": {"max_evals": 0}, "agent": AGENT_CFG["agent"]})
    # what a run killed mid-conversation leaves: a working directory with a transcript
    left = ws.root / ".forge" / "agent" / "_softmax-aa.root.0123abcd"
    left.mkdir(parents=True)
    t = Transcript(left / "transcript.jsonl")
    t.add("start", conversation=left.name, card="_softmax-aa", parent="root")
    t.add("query", step=1, cost_usd=0.25, usage={})
    t.add("message", step=1, message={"role": "assistant", "text": "half a thought", "tool_calls": []})
    agent = build_agent(cfg, ws.root, provider=ScriptedProvider([]), environ={})
    rec = Recorder()
    search = Search(ws, cfg, agent, FakePool())
    search.bus.subscribe(rec)
    summary = search.run()
    kept = [e for e in rec.events if e.kind == "agent_interrupted"]
    assert len(kept) == 1 and kept[0].cost_usd == 0.25 and kept[0].conversation == left.name
    assert summary.cost_usd == pytest.approx(0.25) and not left.exists()
    with ws.git() as repo:
        log = SearchStore(repo).load().log
    commit = next(r.commit for r in log if r.kind == "agent_interrupted")
    saved = json.loads(subprocess.run(["git", "-C", str(ws.root), "show", f"{commit}:forge-log/transcript.json"],
                                      capture_output=True, text=True, check=True).stdout)
    assert saved[-1]["message"]["text"] == "half a thought"
    # a resumed run counts that money again from the log, and records the conversation only once
    search2 = Search(ws, cfg, build_agent(cfg, ws.root, provider=ScriptedProvider([]), environ={}), FakePool())
    assert search2.run(resume=True).cost_usd == pytest.approx(0.25)


def test_a_failing_provider_stops_the_agent_and_the_templates_go_on(tmp_path):
    from search_helpers import FakePool, make_workspace, synthetic_card

    from forge_tui.agent import build_agent
    from forge_tui.search.proposer import CombinedProposer
    from forge_tui.search.runner import Search
    from forge_tui.templates.proposer import TemplateProposer

    ws = make_workspace(tmp_path / "ws", [synthetic_card("_softmax-aa", 0.5, 10.0, 1.0)])
    cfg = parse_config({"search": {"max_evals": 6, "evals_per_card": 6, "parallel": 1},
                        "agent": {**AGENT_CFG["agent"], "failures": 2}})
    err = ProviderError("anthropic: 503 service unavailable (after 4 retries)", retryable=True, status=503)
    prov = ScriptedProvider([err] * 10)
    templates = TemplateProposer()
    combined = CombinedProposer(build_agent(cfg, ws.root, provider=prov, environ={}, template=templates), templates)
    rec = Recorder()
    search = Search(ws, cfg, combined, FakePool())
    search.bus.subscribe(rec)
    summary = search.run()
    failed = [e for e in rec.events if isinstance(e, ProposerFailed)]
    assert len(prov.calls) == 2 and len(failed) == 2  # the agent stopped after two failures in a row
    assert failed[-1].stopped and "2 conversations in a row failed" in failed[-1].reason
    nodes = [e for e in rec.events if isinstance(e, NodeAdded) and not e.is_root]
    # the templates wrote every child, before the failures (the root's first) and after them, until
    # they had nothing more for this small card
    assert summary.evaluations >= 3 and {n.proposer for n in nodes} == {"templates"}
    assert summary.finished["_softmax-aa"] == "the proposer has nothing more to try"
    assert summary.cost_usd == 0


def test_a_refused_key_stops_the_agent_at_once(tmp_path):
    from search_helpers import FakePool, make_workspace, synthetic_card

    from forge_tui.agent import build_agent
    from forge_tui.search.runner import Search

    ws = make_workspace(tmp_path / "ws", [synthetic_card("_softmax-aa", 0.5, 10.0, 1.0)])
    cfg = parse_config({"search": {"max_evals": 4, "parallel": 1}, "agent": AGENT_CFG["agent"]})
    prov = ScriptedProvider([ProviderError("anthropic: 401 invalid x-api-key", retryable=False, status=401)] * 5)
    rec = Recorder()
    summary = Search(ws, cfg, build_agent(cfg, ws.root, provider=prov, environ={}), FakePool(), bus=None)
    summary.bus.subscribe(rec)
    out = summary.run()
    assert len(prov.calls) == 1 and out.evaluations == 0
    assert "refused" in out.finished["_softmax-aa"] and "401" in out.finished["_softmax-aa"]


def test_session_picks_the_agent_only_with_a_provider(tmp_path, monkeypatch):
    from search_helpers import make_workspace, synthetic_card

    from forge_tui.session import Session

    ws = make_workspace(tmp_path / "ws", [synthetic_card("_softmax-aa", 0.5, 10.0, 1.0)])
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    s = Session.open(ws.root)
    choice = s.proposer("auto")
    assert choice.proposer.name == "templates" and "no LLM API key" in choice.why
    from forge_tui.errors import ForgeError

    with pytest.raises(ForgeError, match="not available: no LLM API key"):
        s.proposer("agent")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-" + "y" * 30)
    choice = s.proposer("auto")
    assert choice.proposer.name == "agent+templates" and "ANTHROPIC_API_KEY is set" in choice.why
    assert "sk-ant-test" not in choice.why
    os.environ.pop("ANTHROPIC_API_KEY")


@pytest.mark.parametrize("provider", ["anthropic", "openai-compatible"])
def test_agent_through_the_real_sdk_clients_against_a_fake_server(tmp_path, provider):
    """The providers' real code paths inside a search: the SDK client, its retry on 429, the wire
    format of tool calls and results, usage and money, the key kept out of every record."""
    from fake_llm import FakeLLM, anthropic_message, error, openai_completion
    from search_helpers import FakePool, make_workspace, synthetic_card

    from forge_tui.agent import build_agent
    from forge_tui.search.runner import Search

    ws = make_workspace(tmp_path / "ws", [synthetic_card("_softmax-aa", 0.5, 10.0, 1.0)])
    key = "sk-fake-" + "k" * 40
    with FakeLLM() as fake:
        agent_cfg = {"provider": provider, "model": "m", "base_url": fake.base_url if provider == "anthropic"
                     else fake.openai_base_url, "input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0,
                     "api_key_env": "FORGE_TEST_KEY", "retries": 2}
        cfg = parse_config({"search": {"max_evals": 1, "parallel": 1}, "agent": agent_cfg})
        source = "// kernel\n" + FIXED
        if provider == "anthropic":
            replies = [anthropic_message("writing", [("t1", "write_file", {"path": "candidate.cpp", "content": source}),
                                                     ("t2", "compile", {})], input_tokens=1000, output_tokens=100),
                       error(429, "slow down", retry_after_ms=1),
                       anthropic_message("", [("t3", "submit", {"move": "naive rows"})], input_tokens=2000,
                                         output_tokens=50)]
        else:
            replies = [openai_completion("writing", [("t1", "write_file", {"path": "candidate.cpp", "content": source}),
                                                     ("t2", "compile", {})], prompt_tokens=1000, completion_tokens=100),
                       error(429, "slow down", retry_after_ms=1),
                       openai_completion(None, [("t3", "submit", {"move": "naive rows"})], prompt_tokens=2000,
                                         completion_tokens=50)]
        fake.reply(*replies)
        agent = build_agent(cfg, ws.root, environ={"FORGE_TEST_KEY": key})
        rec = Recorder()
        search = Search(ws, cfg, agent, FakePool())
        search.bus.subscribe(rec)
        summary = search.run()
    assert len(fake.requests) == 3  # two queries, the second answered 429 first and retried by the SDK
    node = next(e for e in rec.events if isinstance(e, NodeAdded) and not e.is_root)
    assert node.status == "passed" and node.move == "agent: naive rows"
    assert summary.cost_usd == pytest.approx((3000 * 3.0 + 150 * 15.0) / 1e6)
    last = fake.requests[-1].body
    if provider == "anthropic":
        results = [b for b in last["messages"][-1]["content"] if b["type"] == "tool_result"]
        assert [b["tool_use_id"] for b in results] == ["t1", "t2"] and last["tools"][0]["input_schema"]["type"] == "object"
    else:
        assert [m["tool_call_id"] for m in last["messages"] if m["role"] == "tool"] == ["t1", "t2"]
        assert last["tools"][0]["type"] == "function"
    transcript = git(ws, "show", f"search/{node.card}/{node.node}:candidate/transcript.json")
    assert key not in transcript and "compile" in transcript
    assert key not in git(ws, "log", "--all", "-p")
