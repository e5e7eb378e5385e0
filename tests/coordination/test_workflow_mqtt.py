"""A workflow whose facts travel through a real MQTT broker (``--mqtt HOST:PORT``)."""

import socket
from pathlib import Path

from marsys_mem.cli.main import main
from marsys_mem.workflow import MqttSettings, run_workflow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workflows" / "research_team.yaml"


def test_research_team_over_mqtt(mqtt_broker, tmp_path):
    settings = MqttSettings(
        host=mqtt_broker.host, port=mqtt_broker.port, protocol=mqtt_broker.protocol
    )
    report = run_workflow(EXAMPLE, store_dir=tmp_path / "store", mqtt=settings)
    assert report.ok, report.to_text()
    assert report.transport == f"mqtt://{mqtt_broker.host}:{mqtt_broker.port} (namespace default)"
    planner = report.memory("planner")
    assert any("61,000" in f.text for f in planner.facts)
    assert len([f for f in report.facts if f.merged_from]) == 4


def test_workflow_file_names_its_broker(mqtt_broker, tmp_path, capsys):
    path = tmp_path / "wf.yaml"
    path.write_text(
        "memory: {store: {backend: memory}}\n"
        "transport:\n"
        f"  mqtt: {{host: {mqtt_broker.host}, port: {mqtt_broker.port}, namespace: team,"
        f" protocol: '{mqtt_broker.protocol}'}}\n"
        "agents: [a, b]\n"
        "steps:\n"
        "  - share: {agent: a, fact: The build is green, scope: global}\n"
        "  - ask: {agent: b, question: 'Is the build green?', expect: [green]}\n"
    )
    assert main(["run", str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert f"mqtt://{mqtt_broker.host}:{mqtt_broker.port} (namespace team)" in out
    assert "✓ 'green'" in out


def test_unreachable_broker_is_a_runtime_failure(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    path = tmp_path / "wf.yaml"
    path.write_text(
        "agents: [a]\n"
        f"transport: {{mqtt: {{host: 127.0.0.1, port: {port}, connect_timeout: 0.5}}}}\n"
    )
    assert main(["run", str(path), "-q", "--store", str(tmp_path / "store")]) == 1
    assert "error:" in capsys.readouterr().err


def _signed_workflow(tmp_path, broker, var):
    path = tmp_path / "wf.yaml"
    path.write_text(
        "memory: {store: {backend: memory}}\n"
        "transport:\n"
        f"  mqtt: {{host: {broker.host}, port: {broker.port}, namespace: team,"
        f" protocol: '{broker.protocol}', signing_key_env: {var}}}\n"
        "agents: [a, b]\n"
        "steps:\n"
        "  - share: {agent: a, fact: The build is green, scope: global}\n"
        "  - ask: {agent: b, question: 'Is the build green?', expect: [green]}\n"
    )
    return path


def test_workflow_signs_its_envelopes_with_a_key_from_the_environment(
    mqtt_broker, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("TEAM_SIGNING_KEY", "a-test-key-of-at-least-16-bytes")
    path = _signed_workflow(tmp_path, mqtt_broker, "TEAM_SIGNING_KEY")
    assert "a-test-key" not in path.read_text()
    assert main(["run", str(path), "-q"]) == 0
    assert "✓ 'green'" in capsys.readouterr().out


def test_signed_workflow_without_its_key_fails_naming_the_variable(
    mqtt_broker, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("TEAM_SIGNING_KEY", raising=False)
    path = _signed_workflow(tmp_path, mqtt_broker, "TEAM_SIGNING_KEY")
    assert main(["run", str(path), "-q"]) != 0
    err = capsys.readouterr().err
    assert "TEAM_SIGNING_KEY" in err
    assert "Traceback" not in err


def test_signing_key_env_must_be_a_variable_name(tmp_path, capsys):
    path = tmp_path / "wf.yaml"
    path.write_text(
        "agents: [a]\n"
        "transport: {mqtt: {host: 127.0.0.1, signing_key_env: 'not a name'}}\n"
    )
    assert main(["validate", str(path)]) == 2
    assert "signing_key_env" in capsys.readouterr().err
