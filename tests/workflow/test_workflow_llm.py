"""Workflows with a real model: the ``llm:`` section, ``ask`` through the SDKs, ``facts`` steps.

The model is the real ``openai`` / ``anthropic`` SDK client talking to
:mod:`marsys_mem.testing.llm_server` on loopback, which records every request body: the
tests check what was actually sent (the agent's bounded window), what was recorded, and
that HTTP errors and timeouts end up in the report with the memory intact.
"""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from marsys_mem import MemoryManager
from marsys_mem.cli.main import main
from marsys_mem.config.models import LLMConfig, MemoryConfig
from marsys_mem.exceptions import LLMError
from marsys_mem.llm.factory import llm_problems, make_llm
from marsys_mem.llm.trust import key_env
from marsys_mem.model.traces import trace_of
from marsys_mem.store.sqlite import SQLiteStore
from marsys_mem.testing.llm_server import (
    Reply,
    Request,
    ScriptedServer,
    anthropic_message,
    chat_completion,
    echo_chat,
    openai_error,
)
from marsys_mem.workflow import FileTrust, WorkflowError, check_file, load_workflow, run_workflow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "workflows" / "chat_llm.yaml"


@pytest.fixture(autouse=True)
def _data_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MARSYS_MEM_HOME", str(tmp_path_factory.mktemp("marsys-home")))


@pytest.fixture
def server():
    srv = ScriptedServer(echo_chat)
    yield srv
    srv.close()


def write(tmp_path: Path, text: str, name: str = "workflow.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def chat_workflow(tmp_path: Path, llm: str, steps: str, *, max_messages: int = 4) -> Path:
    """A persistent assistant (SQLite) with a small window, the given llm: and steps."""
    head = textwrap.dedent(
        f"""
        name: llm_chat
        llm: {llm}
        memory:
          store: {{backend: sqlite, path: mem.db}}
          defaults:
            retention: persistent
            context: {{max_messages: {max_messages}, max_tokens: 4000}}
        agents:
          - {{name: assistant, system: You are a terse assistant.}}
        steps:
        """
    ).lstrip()
    body = textwrap.indent(textwrap.dedent(steps).strip(), "  ")
    path = tmp_path / "workflow.yaml"
    path.write_text(head + body + "\n")
    return path


def stored(tmp_path: Path, agent: str = "assistant"):
    with SQLiteStore(tmp_path / "mem.db") as store:
        return store.load_messages(("default", agent, "main"))


SAYS = """
- say: {agent: assistant, text: "first: my locker code is 4471"}
- say: {agent: assistant, role: assistant, text: "noted"}
- say: {agent: assistant, text: "second: the meeting is on Tuesday"}
- say: {agent: assistant, role: assistant, text: "ok"}
- say: {agent: assistant, text: "third: bring the blue folder"}
- say: {agent: assistant, role: assistant, text: "sure"}
"""


# ---------------------------------------------------------------------------- openai
def test_ask_sends_the_bounded_window_and_records_the_answer(tmp_path, server):
    server.queue(
        Reply(body=chat_completion("Bring the blue folder on Tuesday.", model="local-model"))
    )
    path = chat_workflow(
        tmp_path,
        f"{{provider: openai, model: local-model, base_url: '{server.url}/v1'}}",
        SAYS + '- ask: {agent: assistant, question: "What should I bring?", expect: blue}',
    )
    report = run_workflow(path)

    assert report.ok, report.to_text()
    assert report.llm == "openai:local-model"
    ask = report.asks[0]
    assert ask.answer == "Bring the blue folder on Tuesday."
    assert ask.model == "openai:local-model"
    assert ask.error is None
    assert ask.usage == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}

    # what the server received: the system prompt and the newest messages of the window
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == "local-model"
    sent = request.body["messages"]
    assert len(sent) == ask.context_messages == 4  # max_messages, the system prompt kept
    assert sent[0] == {"role": "system", "content": "You are a terse assistant."}
    assert sent[-1] == {"role": "user", "content": "What should I bring?"}
    assert [m["content"] for m in sent[1:-1]] == ["third: bring the blue folder", "sure"]
    assert "4471" not in json.dumps(sent)  # dropped from the window: never sent

    # recorded: the question and the answer, the call in the answer's trace
    messages = stored(tmp_path)
    assert [m.role for m in messages[-2:]] == ["user", "assistant"]
    assert messages[-2].text == "What should I bring?"
    answer = messages[-1]
    assert answer.text == "Bring the blue folder on Tuesday."
    (step,) = trace_of(answer)
    assert step.kind == "llm"
    assert step.name == "openai:local-model"
    assert step.ok
    assert step.usage["total_tokens"] == 13
    assert step.arguments == {
        "question": "What should I bring?",
        "messages": 4,
        "tokens": ask.context_tokens,
    }
    assert step.duration_ms > 0


def test_the_next_question_sees_the_recorded_answer(tmp_path, server):
    path = chat_workflow(
        tmp_path,
        f"{{model: m, base_url: '{server.url}/v1'}}",
        """
        - ask: {agent: assistant, question: "Say one"}
        - ask: {agent: assistant, question: "Say two"}
        """,
        max_messages=10,
    )
    report = run_workflow(path)
    assert [a.answer for a in report.asks] == ["You said: Say one", "You said: Say two"]
    second = server.requests[1].body["messages"]
    assert [m["content"] for m in second[1:]] == ["Say one", "You said: Say one", "Say two"]


def test_without_llm_ask_stays_offline(tmp_path, server):
    path = chat_workflow(tmp_path, "null", SAYS + '- ask: {agent: assistant, question: "Bring?"}')
    report = run_workflow(path)
    assert server.requests == []
    assert report.llm is None
    assert report.asks[0].model is None
    assert report.asks[0].answer == "third: bring the blue folder"  # the best match
    assert stored(tmp_path)[-1].text == "sure"  # nothing recorded by the ask


# ---------------------------------------------------------------------------- anthropic
def test_ask_through_the_anthropic_sdk(tmp_path, server, monkeypatch):
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", "sk-ant-test")
    server.queue(
        Reply(body=anthropic_message({"type": "text", "text": "Tuesday."}, model="claude-x"))
    )
    path = chat_workflow(
        tmp_path,
        f"{{provider: anthropic, model: claude-x, base_url: '{server.url}', "
        "api_key_env: TEST_ANTHROPIC_KEY, max_tokens: 50}",
        SAYS + '- ask: {agent: assistant, question: "When is the meeting?"}',
    )
    # a file's own key variable and server: allowed by the user, outside the file
    trust = FileTrust(allow_env={"TEST_ANTHROPIC_KEY"}, allow_base_url={server.url})
    report = run_workflow(path, trust=trust)
    assert report.ok, report.to_text()
    ask = report.asks[0]
    assert ask.answer == "Tuesday."
    assert ask.usage == {"input_tokens": 10, "output_tokens": 3}
    (request,) = server.requests
    assert request.path == "/v1/messages"
    assert "sk-ant-test" in json.dumps(request.headers)  # read from the named variable
    body = request.body
    assert body["model"] == "claude-x"
    assert body["max_tokens"] == 50
    assert body["system"] == "You are a terse assistant."
    assert body["messages"][-1] == {"role": "user", "content": "When is the meeting?"}
    assert len(body["messages"]) == 3  # the window: system prompt + 3 newest messages
    assert "4471" not in json.dumps(body)
    assert stored(tmp_path)[-1].text == "Tuesday."


# ---------------------------------------------------------------------------- errors
def test_model_errors_are_reported_and_memory_is_kept(tmp_path, server, capsys):
    server.queue(
        Reply(500, openai_error("the GPU caught fire")),
        Reply(429, openai_error("slow down", "rate_limit"), headers={"retry-after": "0"}),
        Reply(body=chat_completion("late"), delay=1.5),
        Reply(200, "{not json"),
        Reply(body=chat_completion("Recovered.")),
    )
    path = chat_workflow(
        tmp_path,
        f"{{model: m, base_url: '{server.url}/v1', max_retries: 0, timeout: 0.5}}",
        """
        - ask: {agent: assistant, question: "q1"}
        - say: {agent: assistant, text: "after the 500"}
        - ask: {agent: assistant, question: "q2"}
        - ask: {agent: assistant, question: "q3"}
        - ask: {agent: assistant, question: "q4"}
        - ask: {agent: assistant, question: "q5"}
        """,
        max_messages=20,
    )
    code = main(["run", str(path), "-q"])
    out = capsys.readouterr().out
    assert code == 1
    assert "HTTP 500: the GPU caught fire" in out
    assert "HTTP 429: slow down" in out
    assert "timed out after 0.5 s" in out
    assert "the server's response is not valid JSON" in out  # an LLMError from the adapter
    assert "FAILED: 4 model call(s) failed" in out
    assert "answer: Recovered." in out

    code = main(["run", str(path), "--json", "-q", "--append"])  # a new run: the store grows
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["ok"]
    errors = [a for a in report["asks"] if a["error"]]
    assert errors == []

    # the first run lost nothing: every question and the one answer are stored, in order
    texts = [m.text for m in stored(tmp_path)]
    assert texts[0] == "You are a terse assistant."
    assert texts[1:8] == ["q1", "after the 500", "q2", "q3", "q4", "q5", "Recovered."]
    # the failed calls are in the run's trace with their errors
    with SQLiteStore(tmp_path / "mem.db") as store:
        runs = [store.load_run(r) for r in store.list_runs(agent="assistant")]
    steps = [s for r in runs if r is not None for s in r.trace]
    failed = [s.error for s in steps if not s.ok]
    assert len(failed) == 4
    assert "HTTP 500" in failed[0]
    assert "HTTP 429" in failed[1]
    assert "timed out" in failed[2]
    assert "not valid JSON" in failed[3]


# ---------------------------------------------------------------------------- checks
def test_llm_section_errors_are_located(tmp_path):
    path = write(
        tmp_path,
        """
        agents: [a]
        llm:
          provider: azure
          model: gpt
          api_key: sk-secret-123
          api_key_env: sk-secret-456
          timeout: 0
        """,
    )
    with pytest.raises(WorkflowError) as err:
        load_workflow(path)
    text = str(err.value)
    assert "workflow.yaml:5: llm.api_key: never put an API key in a file" in text
    assert "sk-secret" not in text  # neither the key nor a key written as a name
    assert "workflow.yaml:6: llm.api_key_env: api_key_env is the NAME" in text
    assert "workflow.yaml:7: llm.timeout" in text


def test_azure_needs_an_endpoint_and_a_version(tmp_path):
    path = write(tmp_path, "agents: [a]\nllm: {provider: azure, model: gpt}\n")
    with pytest.raises(WorkflowError) as err:
        load_workflow(path)
    assert "llm.base_url: provider 'azure' needs base_url" in str(err.value)
    assert "llm.api_version: provider 'azure' needs api_version" in str(err.value)
    path = write(tmp_path, "agents: [a]\nllm: {model: gpt, api_version: '2024-10-21'}\n")
    with pytest.raises(WorkflowError, match="api_version is only used by provider 'azure'"):
        load_workflow(path)


def test_a_missing_key_variable_fails_the_check_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    path = write(
        tmp_path,
        """
        agents: [a]
        llm:
          provider: anthropic
          model: claude-x
          api_key_env: NO_SUCH_KEY_VAR
        memory: {store: {backend: sqlite, path: mem.db}}
        steps:
          - ask: {agent: a, question: hi}
        """,
    )
    with pytest.raises(WorkflowError) as err:
        run_workflow(path)
    assert (
        "workflow.yaml:5: llm.api_key_env: environment variable 'NO_SUCH_KEY_VAR' is not set"
        in str(err.value)
    )
    assert not (tmp_path / "mem.db").exists()
    monkeypatch.setenv("NO_SUCH_KEY_VAR", "")
    with pytest.raises(WorkflowError, match="'NO_SUCH_KEY_VAR' is empty"):
        load_workflow(path)
    # OpenAI itself needs OPENAI_API_KEY, named although the file does not say it
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    path = write(tmp_path, "agents: [a]\nllm: {model: gpt-4o-mini}\n")
    with pytest.raises(
        WorkflowError, match=r"llm\.api_key_env: environment variable 'OPENAI_API_KEY'"
    ):
        load_workflow(path)


def test_a_missing_sdk_extra_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setitem(sys.modules, "anthropic", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "marsys_mem.llm.anthropic", raising=False)
    path = write(tmp_path, "agents: [a]\nllm:\n  provider: anthropic\n  model: claude-x\n")
    with pytest.raises(WorkflowError) as err:
        load_workflow(path)
    assert "workflow.yaml:3: llm.provider: provider 'anthropic' needs the anthropic SDK" in str(
        err.value
    )
    assert "pip install 'marsys-mem[anthropic]'" in str(err.value)
    with pytest.raises(LLMError, match=r"llm\.provider"):
        make_llm(LLMConfig(provider="anthropic", model="claude-x"))


def test_llm_in_a_policy_file(tmp_path, server, monkeypatch):
    monkeypatch.delenv("POLICY_KEY", raising=False)
    write(
        tmp_path,
        f"""
        defaults: {{retention: session}}
        llm:
          model: local-model
          base_url: {server.url}/v1
          api_key_env: POLICY_KEY
        """,
        "policy.yaml",
    )
    wf = write(
        tmp_path,
        """
        memory: {config: policy.yaml}
        agents: [a]
        steps:
          - ask: {agent: a, question: "hello?"}
        """,
    )
    with pytest.raises(WorkflowError) as err:  # located in the policy file
        load_workflow(wf)
    assert "policy.yaml:5: llm.api_key_env: environment variable 'POLICY_KEY'" in str(err.value)
    code = main(["validate", str(tmp_path / "policy.yaml")])
    assert code != 0

    monkeypatch.setenv("POLICY_KEY", "sk-policy")
    # the user allows the file's own variable and server (the user-level setting)
    monkeypatch.setenv("MARSYS_MEM_ALLOW_ENV", "POLICY_KEY")
    monkeypatch.setenv("MARSYS_MEM_ALLOW_BASE_URL", server.url)
    report = run_workflow(wf, store_dir=tmp_path / "s")
    assert report.asks[0].answer == "You said: hello?"
    assert server.requests[0].headers["authorization"] == "Bearer sk-policy"
    assert check_file(tmp_path / "policy.yaml").kind == "config"

    # the workflow's own llm: wins over the policy file's
    text = wf.read_text() + f"llm: {{model: other, base_url: '{server.url}/v1'}}\n"
    wf.write_text(text)
    run_workflow(wf, store_dir=tmp_path / "s")
    assert server.requests[-1].body["model"] == "other"


def test_memory_manager_builds_the_config_llm(server, monkeypatch):
    monkeypatch.delenv("MM_KEY", raising=False)
    config = MemoryConfig.model_validate(
        {"llm": {"model": "m", "base_url": f"{server.url}/v1", "api_key_env": "MM_KEY"}}
    )
    with pytest.raises(LLMError, match=r"llm\.api_key_env: environment variable 'MM_KEY'"):
        MemoryManager(config)
    monkeypatch.setenv("MM_KEY", "sk-x")
    with MemoryManager(config) as manager:
        assert manager.llm is not None
        assert manager.llm.complete("ping") == "You said: ping"


def test_factory(monkeypatch):
    monkeypatch.setenv("AZ_KEY", "k")
    cfg = LLMConfig(
        provider="azure",
        model="dep",
        base_url="https://x.openai.azure.com",
        api_version="2024-10-21",
        api_key_env="AZ_KEY",
    )
    assert key_env(cfg) == "AZ_KEY"
    assert llm_problems(cfg) == []
    with make_llm(cfg) as llm:
        assert llm.provider == "azure"
        assert llm.model == "dep"
    assert (
        key_env(LLMConfig(provider="azure", model="d", base_url="https://x", api_version="v"))
        == "AZURE_OPENAI_API_KEY"
    )
    assert llm_problems(LLMConfig(model="m"), environ={})[0][0] == "api_key_env"


# ---------------------------------------------------------------------------- facts
FACTS = """
name: facts_wf
memory:
  defaults:
    patterns: {embedder: hashing, facts: {subject: maria, debounce: 0}}
agents: [assistant, {name: other}]
steps:
  - say: {agent: assistant, text: "Hi, my name is Maria and I live in Lisbon."}
  - facts: {agent: assistant, expect: [Lisbon, Maria]}
  - say: {agent: assistant, text: "I live in Porto now."}
  - facts:
      subject: maria
      add:
        - I prefer aisle seats
        - {text: "Maria is allergic to peanuts", category: identity, slot: "allergy:peanuts"}
        - I prefer aisle seats
      query: peanuts
      k: 2
      expect: [Porto, peanuts]
  - facts: {subject: nobody, expect: Lisbon}
"""


def test_facts_step_and_facts_learned_per_subject(tmp_path):
    report = run_workflow(write(tmp_path, FACTS), store_dir=tmp_path / "s")
    first, second, third = report.fact_checks
    assert first.subject == "maria"
    assert first.ok
    assert {f.text for f in first.known} == {"User's name is Maria", "User lives in Lisbon"}
    assert second.added == [
        "added: I prefer aisle seats",
        "added: Maria is allergic to peanuts",
        "reinforced: I prefer aisle seats",
    ]
    assert second.ok
    assert "User lives in Lisbon" not in {f.text for f in second.known}
    assert second.hits[0].text == "Maria is allergic to peanuts"
    assert len(second.hits) == 2
    assert third.subject == "nobody"
    assert third.known == []
    assert third.missing == ["Lisbon"]
    assert not report.ok

    (maria,) = report.subject_facts
    by_text = {f.text: f for f in maria.facts}
    assert by_text["User lives in Lisbon"].valid is False
    assert by_text["User lives in Lisbon"].superseded_by == "User lives in Porto now"
    assert by_text["I prefer aisle seats"].reinforcements == 1
    text = report.to_text()
    assert "== Fact checks (3)" in text
    assert "== Facts learned (5)" in text
    assert "superseded by 'User lives in Porto now'" in text
    assert "FAILED: 1 facts step(s) did not find what they expected" in text

    # a run on the same store learns nothing new: its report lists no learned facts, and
    # its facts step sees what the first run left in the store
    check = """
    memory: {defaults: {patterns: {embedder: hashing, facts: {subject: maria}}}}
    agents: [assistant]
    steps:
      - facts: {agent: assistant, expect: [Porto, aisle seats]}
    """
    again = run_workflow(write(tmp_path, check, "check.yaml"), store_dir=tmp_path / "s")
    assert again.ok, again.to_text()
    assert again.subject_facts == []
    assert len(again.fact_checks[0].known) == 4


def test_facts_step_errors_are_located(tmp_path):
    path = write(
        tmp_path,
        """
        agents: [a]
        steps:
          - facts: {agent: b}
          - facts: {branch: main}
          - facts: {subject: "bad/name", add: [""]}
        """,
    )
    with pytest.raises(WorkflowError) as err:
        load_workflow(path)
    text = str(err.value)
    assert "workflow.yaml:3: steps[0].agent: unknown agent 'b'" in text
    assert "workflow.yaml:4: steps[1].branch: branch is only used with agent" in text
    assert "workflow.yaml:5: steps[2].subject" in text
    assert "workflow.yaml:5: steps[2].add[0]: String should have at least 1 character" in text


def test_llm_extractor_learns_through_the_workflow_llm(tmp_path, server):
    def responder(request: Request) -> Reply:
        if "response_format" in request.body:  # the extractor's structured call
            facts = {"facts": [{"text": "Ana keeps bees", "category": "other", "slot": "hobby"}]}
            return Reply(body=chat_completion(json.dumps(facts)))
        return echo_chat(request)

    server.responder = responder
    path = write(
        tmp_path,
        f"""
        llm: {{model: m, base_url: '{server.url}/v1'}}
        memory:
          defaults:
            patterns: {{embedder: hashing, facts: {{subject: ana, extractor: llm, debounce: 0}}}}
        agents: [assistant]
        steps:
          - say: {{agent: assistant, text: "Honestly the hives keep me busy every weekend."}}
          - facts: {{agent: assistant, expect: bees}}
          - ask: {{agent: assistant, question: "What do I do on weekends?", expect_sent: bees}}
        """,
    )
    report = run_workflow(path, store_dir=tmp_path / "s")
    assert report.ok, report.to_text()
    assert report.asks[0].user_facts == 1
    sent = json.dumps(server.requests[-1].body["messages"])
    assert "Known facts about ana" in sent
    assert "Ana keeps bees" in sent


# ---------------------------------------------------------------------------- example
def test_the_example_runs_against_a_local_server(tmp_path, server, capsys):
    text = EXAMPLE.read_text().replace("http://127.0.0.1:8765/v1", f"{server.url}/v1")
    path = tmp_path / "chat_llm.yaml"
    path.write_text(text)
    code = main(["run", str(path), "-q", "--store", str(tmp_path / "s")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "answer: You said: Book me a flight for Friday." in out
    assert main(["validate", str(EXAMPLE)]) == 0  # no key needed for a base_url server
    assert "model openai:local-model" in capsys.readouterr().out
    assert "superseded by" in out
    assert len(server.requests) == 2
    first = server.requests[0].body["messages"]
    assert len(first) <= 6  # max_messages: the small talk pushed the first messages out
    assert "Known facts about dana" in json.dumps(first)


def test_an_llm_extractor_without_llm_fails_the_check(tmp_path):
    path = write(
        tmp_path,
        """
        memory:
          agents:
            assistant:
              patterns: {facts: {extractor: llm}}
        agents: [assistant, other]
        """,
    )
    with pytest.raises(WorkflowError) as err:
        load_workflow(path)
    assert (
        "workflow.yaml:4: memory.agents.assistant.patterns.facts.extractor: extractor 'llm' "
        "needs a model" in str(err.value)
    )
