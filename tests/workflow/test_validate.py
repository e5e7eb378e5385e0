"""Validating workflow and retention-policy files: every error in one run, each at its line.

Regression tests for issue 9, item 12: errors used to come in stages (the first field error
hid the rest, field errors hid the unknown agents, the first unknown agent hid the
second), nested context fields of an agent were reported at the top of the file, only agent
names and step kinds got a "did you mean", a misspelled agent under ``memory.agents``
passed, and ``persistent`` retention with the in-memory store passed without a word.
"""

import logging
import re
import textwrap
import time
from pathlib import Path

import pytest

from marsys_mem.cli.main import main
from marsys_mem.exceptions import MarsysMemError
from marsys_mem.workflow import (
    SayStep,
    Workflow,
    WorkflowError,
    check_file,
    load_workflow,
    prepare_workflow,
    run_workflow,
    validate_config_file,
)

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "wf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def errors_of(path: Path) -> list[str]:
    with pytest.raises(WorkflowError) as err:
        validate_config_file(path)
    return str(err.value).splitlines()


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------- all at once
THREE_TYPOS = """
    memory:
      defaults:
        retention: session
        context:
          max_tokens: 1000
          stratgy: summarize
    agents:
      - name: planner
        sytem: You plan.
    steps:
      - say: {agent: planner, txt: hi}
    """


def test_three_typos_on_three_lines_give_three_errors_in_one_run(tmp_path):
    path = write(tmp_path, THREE_TYPOS)
    assert errors_of(path) == [
        f"{path}:6: memory.defaults.context.stratgy: unknown field (did you mean 'strategy'?)",
        f"{path}:9: agents[0].sytem: unknown field (did you mean 'system'?)",
        f"{path}:11: steps[0].txt: unknown field (did you mean 'text'?)",
    ]


def test_cli_validate_prints_each_error_on_its_own_line(capsys, tmp_path):
    path = write(tmp_path, THREE_TYPOS)
    code, out, err = cli(capsys, "validate", path)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert [re.match(r"error: \S+:(\d+): ", line)[1] for line in lines[:3]] == ["6", "9", "11"]
    assert all("did you mean" in line for line in lines[:3])
    assert lines[3:] == ["3 errors"]


def test_agent_context_typos_are_at_their_own_lines_with_the_field_errors(tmp_path):
    """An agent's context was checked after every other field, and reported at line 1."""
    path = write(
        tmp_path,
        """
        version: 1
        agents:
          researcher:
            retention: persistent
            context:
              max_tokens: 4000
              stratgy: summarize
              keep_recnt: 3
            patterns: {rgg: true}
          planner: {retentoin: session}
        """,
        "policy.yaml",
    )
    assert errors_of(path) == [
        f"{path}:7: agents.researcher.context.stratgy: unknown field (did you mean 'strategy'?)",
        f"{path}:8: agents.researcher.context.keep_recnt: unknown field "
        "(did you mean 'keep_recent'?)",
        f"{path}:9: agents.researcher.patterns.rgg: unknown field (did you mean 'rag'?)",
        f"{path}:10: agents.planner.retentoin: unknown field (did you mean 'retention'?)",
    ]


def test_agent_context_that_conflicts_with_the_defaults_is_at_the_context_line(tmp_path):
    path = write(
        tmp_path,
        """
        version: 1
        defaults:
          retention: forever
        agents:
          r:
            retention: session
            context: {keep_recent: 3}
        """,
        "policy.yaml",
    )
    errors = errors_of(path)
    assert errors[0].startswith(f"{path}:3: defaults.retention: Input should be")
    # the defaults are invalid, so only the override's own fields can be checked: none wrong
    assert len(errors) == 1
    path.write_text(
        "version: 1\nagents:\n  r:\n    retention: session\n    context:\n      keep_recent: 3\n"
    )
    assert errors_of(path) == [
        f"{path}:5: agents.r.context: keep_recent only applies to strategy 'summarize', "
        "not 'sliding_window'"
    ]


def test_field_errors_and_unknown_agents_and_branches_come_together(tmp_path):
    path = write(
        tmp_path,
        """
        agents: [planner, researcher]
        steps:
          - say: {agent: planer, text: hi}
          - fork: {parent: mian, child: r1, agents: [researcher]}
          - say: {agent: researcher, text: hello, branch: r1}
          - run:
              agnt: researcher
              steps:
                - say: {agent: resercher, text: x}
                - tool: {agent: researcher, name: s, reslt: 1}
          - merge: {child: r1, into: main}
          - call_agent: {caller: plannr, callee: reseacher, request: a, response: b}
          - end_sesion
        """,
    )
    errors = errors_of(path)
    assert [e.split(": ", 2)[1] for e in errors] == [
        "steps[0].agent",
        "steps[1].parent",
        "steps[3].agnt",
        "steps[3].steps[0].agent",
        "steps[3].steps[1].reslt",
        "steps[5].caller",
        "steps[5].callee",
        "steps[6]",
    ]
    lines = [int(e.split(":")[1]) for e in errors]
    assert lines == [3, 4, 7, 9, 10, 12, 12, 13]
    assert all("did you mean" in e for e in errors), errors
    # r1 was never forked (its parent is wrong): the steps on r1 are not reported again
    assert not any("'r1'" in e for e in errors)


def test_a_python_workflow_reports_every_problem():
    wf = Workflow(
        agents=["a"],
        steps=[SayStep(agent="b", text="x"), SayStep(agent="a", text="y", branch="nope")],
    )
    with pytest.raises(WorkflowError) as err:
        prepare_workflow(wf)
    assert [line.split(":")[0] for line in str(err.value).splitlines()] == [
        "steps[0].agent",
        "steps[1].branch",
    ]


def test_errors_in_a_referenced_config_file_come_with_the_workflow_errors(tmp_path):
    (tmp_path / "policy.yaml").write_text("version: 1\ndefaults:\n  ttl: soon\n  retentoin: x\n")
    path = write(
        tmp_path,
        "memory: {config: policy.yaml}\nagents: [a]\nsteps:\n  - ask: {agent: b, question: q}\n",
    )
    errors = errors_of(path)
    assert errors[0].startswith(f"{path}:4: steps[0].agent: unknown agent 'b'")
    assert errors[1].startswith(f"{tmp_path / 'policy.yaml'}:3: defaults.ttl: invalid duration")
    assert errors[2] == (
        f"{tmp_path / 'policy.yaml'}:4: defaults.retentoin: unknown field "
        "(did you mean 'retention'?)"
    )


def test_unknown_field_without_a_close_name_lists_the_allowed_fields(tmp_path):
    path = write(tmp_path, "agents: [a]\nsteps:\n  - ask: {agent: a, question: q, colour: red}\n")
    assert errors_of(path) == [
        f"{path}:3: steps[0].colour: unknown field; expected one of: agent, question, branch, "
        "expect, expect_sent"
    ]


def test_long_form_steps_and_transport_get_suggestions(tmp_path):
    path = write(
        tmp_path,
        """
        transport: {mqtt: {hots: localhost}}
        agents: [a]
        steps:
          - {kind: share, agent: a, fact: x, scoep: global}
        """,
    )
    errors = errors_of(path)
    assert f"{path}:1: transport.mqtt.hots: unknown field (did you mean 'host'?)" in errors
    assert f"{path}:4: steps[0].scoep: unknown field (did you mean 'scope'?)" in errors


def test_toml_errors_are_all_reported_without_lines(tmp_path):
    path = write(
        tmp_path,
        """
        version = 1
        [defaults]
        retention = "forever"
        [agents.r.context]
        stratgy = "summarize"
        """,
        "p.toml",
    )
    assert errors_of(path) == [
        f"{path}: defaults.retention: Input should be 'single_run', 'session' or 'persistent' "
        "(got 'forever')",
        f"{path}: agents.r.context.stratgy: unknown field (did you mean 'strategy'?)",
    ]


def test_a_file_with_hundreds_of_errors_lists_fifty(tmp_path):
    steps = "".join(f"  - say: {{agent: nobody{i}, text: x}}\n" for i in range(300))
    path = write(tmp_path, "agents: [a]\nsteps:\n" + steps)
    started = time.perf_counter()
    errors = errors_of(path)
    assert time.perf_counter() - started < 1.0
    assert len(errors) <= 52
    assert errors[-1].startswith("...")


# ---------------------------------------------------------------------------- repeats
def test_a_repeat_that_expands_past_the_limit_is_refused_at_once(tmp_path):
    path = write(
        tmp_path,
        """
        agents: [a]
        steps:
          - repeat:
              times: 100000
              steps:
                - say: {agent: a, text: hello}
                - repeat:
                    times: 100000
                    steps: [{say: {agent: a, text: x}}]
        """,
    )
    started = time.perf_counter()
    assert errors_of(path) == [
        f"{path}:3: steps[0]: more than 200000 steps after expanding repeats (200000 at most)"
    ]
    assert time.perf_counter() - started < 1.0  # it took 4 s to find out before


def test_a_substitution_that_makes_a_step_invalid_is_a_workflow_error(tmp_path):
    path = write(
        tmp_path,
        """
        agents: [a]
        steps:
          - repeat:
              times: 2
              items: ["x", ""]
              steps:
                - share: {agent: a, fact: "{item}"}
        """,
    )
    errors = errors_of(path)  # was a raw pydantic ValidationError
    assert errors == [
        f"{path}:7: steps[0].steps[0]: invalid after substituting the repeat's values: fact: "
        "String should have at least 1 character (in repeat iteration 2/2)"
    ]


# ---------------------------------------------------------------------------- memory.agents
def test_a_misspelled_agent_under_memory_agents_is_an_error(tmp_path, capsys):
    path = write(
        tmp_path,
        """
        memory:
          store: {backend: memory}
          agents:
            asistant: {retention: session, context: {max_tokens: 500}}
        agents: [assistant]
        """,
    )
    assert errors_of(path) == [
        f"{path}:4: memory.agents.asistant: no agent 'asistant' in this workflow (did you mean "
        "'assistant'?); its policy would apply to no one (agents: assistant)"
    ]
    code, _, err = cli(capsys, "validate", path)
    assert code == 2
    assert "did you mean 'assistant'?" in err


def test_a_referenced_policy_file_may_name_other_agents_but_a_near_miss_is_a_warning(tmp_path):
    (tmp_path / "team.yaml").write_text(
        "version: 1\nagents:\n  reviewer: {retention: session}\n  asistant: {retention: session}\n"
    )
    path = write(tmp_path, "memory: {config: team.yaml}\nagents: [assistant, planner]\n")
    result = check_file(path)
    assert result.kind == "workflow"
    assert result.warnings == [
        f"{tmp_path / 'team.yaml'}:4: agents.asistant: no agent 'asistant' in the workflow "
        "(did you mean 'assistant'?); that agent gets the defaults"
    ]


# ---------------------------------------------------------------------------- persistent
PERSISTENT_IN_MEMORY = """
    version: 1
    store: {backend: memory}
    agents:
      researcher:
        retention: persistent
      planner: {retention: session}
    """


def test_persistent_with_the_in_memory_store_is_a_warning(tmp_path, capsys):
    path = write(tmp_path, PERSISTENT_IN_MEMORY, "policy.yaml")
    result = check_file(path)
    assert result.kind == "config"
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith(f"{path}:5: agents.researcher.retention: 'persistent'")
    assert "keeps nothing once the process ends" in result.warnings[0]
    code, out, err = cli(capsys, "validate", path)
    assert code == 0
    assert out.startswith("ok: retention config")
    assert err.startswith(f"warning: {path}:5: agents.researcher.retention")
    code, out, err = cli(capsys, "validate", "--strict", path)
    assert code == 2
    assert out == ""
    assert "error: 1 warning (--strict)" in err


def test_persistent_defaults_without_a_store_warn_too(tmp_path):
    """A config file without ``store`` uses the in-memory store."""
    path = write(tmp_path, "version: 1\ndefaults:\n  retention: persistent\n", "p.yaml")
    (warning,) = check_file(path).warnings
    assert warning.startswith(f"{path}:3: defaults.retention: 'persistent'")


def test_persistent_with_sqlite_or_in_a_workflow_without_a_store_is_fine(tmp_path):
    path = write(
        tmp_path,
        PERSISTENT_IN_MEMORY.replace("{backend: memory}", "{backend: sqlite}"),
        "policy.yaml",
    )
    assert check_file(path).warnings == []
    # a workflow without a store runs on SQLite next to the file: persistent is persistent
    wf = write(tmp_path, "memory:\n  defaults: {retention: persistent}\nagents: [a]\n")
    assert check_file(wf).warnings == []


def test_a_workflow_with_an_explicit_in_memory_store_warns_at_the_agent_line(tmp_path):
    path = write(
        tmp_path,
        """
        memory:
          store: {backend: memory}
          agents:
            a: {retention: persistent}
        agents: [a, b]
        """,
    )
    assert check_file(path).warnings == [
        f"{path}:4: memory.agents.a.retention: 'persistent' with the in-memory store "
        "(store.backend 'memory') keeps nothing once the process ends; use store: "
        "{backend: sqlite, path: ...}"
    ]
    assert prepare_workflow(load_workflow(path)).warnings == check_file(path).warnings


# ---------------------------------------------------------------------------- good files
@pytest.mark.parametrize(
    "path",
    [
        *sorted((ROOT / "examples" / "workflows").glob("*")),
        *sorted((ROOT / "examples" / "policies").glob("*")),
    ],
    ids=lambda p: p.name,
)
def test_every_example_is_valid_without_warnings(path):
    result = check_file(path)
    assert result.warnings == []


def test_errors_are_library_errors():
    assert issubclass(WorkflowError, MarsysMemError)
    assert issubclass(WorkflowError, ValueError)


def test_running_warns_through_the_log_unless_a_store_folder_is_given(tmp_path, caplog):
    path = write(
        tmp_path,
        """
        memory:
          store: {backend: memory}
          defaults: {retention: persistent}
        agents: [a]
        steps:
          - say: {agent: a, text: hi}
        """,
    )
    with caplog.at_level(logging.WARNING, logger="marsys_mem.workflow"):
        run_workflow(path)
    assert [r.getMessage() for r in caplog.records if "in-memory store" in r.getMessage()] == [
        f"{path}:3: memory.defaults.retention: 'persistent' with the in-memory store "
        "(store.backend 'memory') keeps nothing once the process ends; use store: "
        "{backend: sqlite, path: ...}"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="marsys_mem.workflow"):
        run_workflow(path, store_dir=tmp_path / "store")  # SQLite there: it persists
    assert not [r for r in caplog.records if "in-memory store" in r.getMessage()]


def test_a_changed_copy_of_a_workflow_is_planned_again(tmp_path):
    """The plan is kept per workflow: a copy with other steps never reuses the original's."""
    path = write(tmp_path, "agents: [a]\nsteps:\n  - say: {agent: a, text: hi}\n")
    wf = load_workflow(path)
    assert prepare_workflow(wf) is prepare_workflow(wf)  # computed once
    longer = wf.model_copy(update={"steps": [*wf.steps, SayStep(agent="a", text="more")]})
    assert prepare_workflow(longer).count == 2
    assert prepare_workflow(wf).count == 1
    broken = wf.model_copy(update={"steps": [SayStep(agent="b", text="x")]})
    with pytest.raises(WorkflowError, match=r"steps\[0\].agent: unknown agent 'b'"):
        prepare_workflow(broken)


def test_a_loaded_workflow_knows_its_file_and_locates_paths_in_it(tmp_path):
    path = write(tmp_path, "agents: [a]\nsteps:\n  - say: {agent: a, text: hi}\n")
    wf = load_workflow(path)
    assert wf.origin is not None
    assert wf.origin.name == str(path)
    assert wf.source == path.resolve()
    assert wf.base_dir == path.resolve().parent
    assert str(wf.locate(("steps", 0, "say", "text"))) == f"{path}:3: steps[0].text"
    python_built = Workflow(agents=["a"], steps=[SayStep(agent="a", text="hi")])
    assert python_built.origin is None
    assert python_built.source is None
    assert str(python_built.locate(("steps", 0, "text"))) == "steps[0].text"


def test_a_referenced_config_file_resolves_its_store_against_its_own_folder(tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "team.yaml").write_text("store: {backend: sqlite, path: data/memory.db}\n")
    path = write(tmp_path, "memory: {config: policies/team.yaml}\nagents: [a]\n")
    prepared = prepare_workflow(load_workflow(path))
    assert prepared.config.source == (policies / "team.yaml").resolve()
    report = run_workflow(path)
    assert report.store == str((policies / "data" / "memory.db").resolve())
