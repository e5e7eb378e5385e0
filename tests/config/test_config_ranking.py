"""patterns.rag.ranking and patterns.rag.ingest in policy files: read, checked, wired."""

import json

import jsonschema
import pytest
import yaml

from marsys_mem import MemoryManager
from marsys_mem.config.load import load_config
from marsys_mem.config.models import MemoryConfig
from marsys_mem.exceptions import ConfigError
from marsys_mem.model.ranking import Ingest, Ranking

YAML = """\
version: 1
store: {backend: sqlite, path: m.db}
agents:
  notes_agent:
    patterns:
      embedder: hashing
      rag:
        k: 3
        ranking: {preset: notes, diversity: 0.1}
        ingest: {background: false, batch_size: 16}
  chat_agent:
    patterns:
      embedder: hashing
      rag: {ranking: conversation}
"""

TOML = """\
version = 1

[store]
backend = "sqlite"
path = "m.db"

[agents.notes_agent.patterns]
embedder = "hashing"

[agents.notes_agent.patterns.rag]
k = 3

[agents.notes_agent.patterns.rag.ranking]
preset = "notes"
diversity = 0.1

[agents.notes_agent.patterns.rag.ingest]
background = false
batch_size = 16

[agents.chat_agent.patterns]
embedder = "hashing"
rag = {ranking = "conversation"}
"""

JSON = json.dumps(
    {
        "version": 1,
        "store": {"backend": "sqlite", "path": "m.db"},
        "agents": {
            "notes_agent": {
                "patterns": {
                    "embedder": "hashing",
                    "rag": {
                        "k": 3,
                        "ranking": {"preset": "notes", "diversity": 0.1},
                        "ingest": {"background": False, "batch_size": 16},
                    },
                }
            },
            "chat_agent": {"patterns": {"embedder": "hashing", "rag": {"ranking": "conversation"}}},
        },
    },
    indent=2,
)


@pytest.mark.parametrize(("suffix", "text"), [(".yaml", YAML), (".toml", TOML), (".json", JSON)])
def test_ranking_and_ingest_are_read_from_every_format(tmp_path, suffix, text):
    path = tmp_path / f"policy{suffix}"
    path.write_text(text)
    config = load_config(path)
    rag = config.policy_for("notes_agent").patterns.rag
    assert rag is not None
    assert rag.ranking == Ranking.of("notes", diversity=0.1)
    assert rag.ingest == Ingest(background=False, batch_size=16)
    chat = config.policy_for("chat_agent").patterns.rag
    assert chat is not None
    assert chat.ranking == Ranking()
    assert chat.ingest == Ingest()


def test_the_manager_builds_the_agents_memory_with_them(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(YAML)
    with MemoryManager.from_config(path) as manager:
        rag = manager.patterns("notes_agent").rag
        assert rag is not None
        assert rag.ranking == Ranking.of("notes", diversity=0.1)
        assert rag.ingest == Ingest(background=False, batch_size=16)
        chat = manager.patterns("chat_agent").rag
        assert chat is not None
        assert chat.ranking == Ranking()


@pytest.mark.parametrize(
    ("ranking", "says"),
    [
        ("{preset: notes, context_turns: 9}", "rag.ranking.context_turns"),
        ("{dense_weight: -1}", "rag.ranking.dense_weight"),
        ("{fusion: sum}", "rag.ranking.fusion"),
        ("chat", "rag.ranking"),
        ("{preset: chat}", "rag.ranking.preset"),
        ("{dense_wieght: 1.0}", "rag.ranking.dense_wieght"),
        ("{strip_names: 'no'}", "rag.ranking.strip_names"),
        ("{dense_weight: 0, bm25_weight: 0}", "cannot both be 0"),
    ],
)
def test_a_bad_ranking_is_refused_with_the_file_line_and_the_field(tmp_path, ranking, says):
    path = tmp_path / "policy.yaml"
    text = YAML.replace("{preset: notes, diversity: 0.1}", ranking)
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert says in message
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "ranking:" in row)
    assert message.startswith(f"{path}:{line}: ")


def test_a_bad_ingest_is_refused_with_the_file_line_and_the_field(tmp_path):
    path = tmp_path / "policy.yaml"
    text = YAML.replace("batch_size: 16", "batch_size: 0")
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"policy.yaml:\d+: .*rag.ingest.batch_size") as info:
        load_config(path)
    assert "got 0" in str(info.value)


def test_a_refused_file_builds_nothing(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(YAML.replace("diversity: 0.1", "diversity: -0.1"))
    with pytest.raises(ConfigError, match="diversity"):
        MemoryManager.from_config(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.yaml"]  # no store made


def test_mode_and_weights_beside_k_are_read_as_fields_of_the_ranking(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(
        YAML.replace(
            "rag: {ranking: conversation}",
            "rag: {mode: bm25, dense_weight: 1.0, bm25_weight: 2.0}",
        )
    )
    rag = load_config(path).policy_for("chat_agent").patterns.rag
    assert rag is not None
    assert rag.ranking == Ranking(mode="bm25", dense_weight=1.0, bm25_weight=2.0)
    path.write_text(
        YAML.replace("k: 3", "k: 3\n        mode: bm25").replace(
            "diversity", "mode: dense, diversity"
        )
    )
    with pytest.raises(ConfigError, match="mode is given twice"):
        load_config(path)


def test_a_dumped_config_loads_back_with_the_same_ranking(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(YAML)
    config = load_config(path)
    again = tmp_path / "again.json"
    again.write_text(config.model_dump_json())
    reloaded = load_config(again)
    assert reloaded.policy_for("notes_agent").patterns.rag == (
        config.policy_for("notes_agent").patterns.rag
    )


@pytest.mark.parametrize(
    ("rag", "valid"),
    [
        ("{ranking: notes, ingest: {batch_size: 3}}", True),
        ("{ranking: {preset: notes, dense_weight: 1}}", True),
        ("{mode: bm25, dense_weight: 1.2}", True),
        ("{ranking: chat}", False),
        ("{ranking: {context_turns: 9}}", False),
        ("{mode: semantic}", False),
        ("{ingest: {index_kind: ivf}}", True),
        ("{ingest: {index_kind: lsh}}", False),
    ],
)
def test_the_json_schema_accepts_what_the_loader_accepts(rag, valid):
    data = yaml.safe_load(f"agents: {{a: {{patterns: {{rag: {rag}}}}}}}")
    errors = list(
        jsonschema.Draft202012Validator(MemoryConfig.model_json_schema()).iter_errors(data)
    )
    assert (errors == []) is valid
    try:
        MemoryConfig.model_validate(data)
    except ValueError:
        loaded = False
    else:
        loaded = True
    assert loaded is valid
