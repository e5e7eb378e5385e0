"""Where a config came from: ``load_config`` records it through the validation context."""

from pathlib import Path

from marsys_mem.config import MemoryConfig, load_config


def test_load_config_records_the_resolved_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "team.json").write_text('{"store": {"backend": "memory"}}')
    cfg = load_config("team.json")
    assert cfg.source == tmp_path.resolve() / "team.json"
    assert cfg.base_dir == tmp_path.resolve()


def test_the_validation_context_sets_the_source(tmp_path: Path) -> None:
    cfg = MemoryConfig.model_validate({}, context={"source": tmp_path / "x.yaml"})
    assert cfg.source == tmp_path / "x.yaml"
    assert cfg.base_dir == tmp_path


def test_a_config_validated_without_context_has_no_source() -> None:
    cfg = MemoryConfig.model_validate({"version": 1})
    assert cfg.source is None
    assert cfg.base_dir is None
    assert MemoryConfig.model_validate({}, context={"other": 1}).source is None
