"""The ``postgres`` store in a config: fields, the DSN from the environment, the manager."""

import pytest
from pydantic import ValidationError

from marsys_mem import MemoryManager, Message
from marsys_mem.config.load import load_config
from marsys_mem.config.models import PG_DSN_ENV, MemoryConfig, PoolConfig, StoreConfig
from marsys_mem.exceptions import ConfigError
from marsys_mem.testing.postgres import PostgresServer


def test_postgres_store_fields() -> None:
    cfg = StoreConfig(backend="postgres", dsn="postgresql://u:pw@h/db", pool={"min": 0, "max": 3})
    assert cfg.pool == PoolConfig(min=0, max=3)
    assert cfg.is_durable
    assert cfg.resolved_dsn({}) == "postgresql://u:pw@h/db"
    assert "pw" not in repr(cfg)
    assert "pw" not in str(cfg.model_dump())
    assert StoreConfig(backend="postgres").dsn_env == PG_DSN_ENV
    assert not StoreConfig().is_durable


@pytest.mark.parametrize(
    ("store", "field", "words"),
    [
        ({"backend": "postgres", "path": "m.db"}, "store", "path is only used by backend 'sqlite'"),
        ({"backend": "sqlite", "dsn": "postgresql://h/db"}, "store", "dsn is only used"),
        ({"backend": "memory", "pool": {"max": 2}}, "store", "pool is only used"),
        ({"backend": "postgres", "pool": {"min": 5, "max": 2}}, "store.pool", "must not exceed"),
        ({"backend": "postgres", "pool": {"max": 0}}, "store.pool.max", "greater than or equal"),
        ({"backend": "postgres", "dsn_env": "NOT A NAME"}, "store.dsn_env", "pattern"),
        ({"backend": "postgres", "connect_timeout": 0}, "store.connect_timeout", "greater"),
    ],
)
def test_bad_postgres_store_fields_name_the_field(store: dict, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        MemoryConfig.model_validate({"store": store})
    text = str(err.value)
    assert field in text
    assert words in text


def test_dsn_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = StoreConfig(backend="postgres", dsn_env="TEAM_PG")
    monkeypatch.delenv("TEAM_PG", raising=False)
    with pytest.raises(ConfigError, match="TEAM_PG"):
        cfg.resolved_dsn()
    monkeypatch.setenv("TEAM_PG", "postgresql://team@db/marsys")
    assert cfg.resolved_dsn() == "postgresql://team@db/marsys"


def test_manager_from_a_postgres_config_shares_memory_between_processes_views(
    tmp_path, monkeypatch: pytest.MonkeyPatch, postgres_server: PostgresServer
) -> None:
    """Two managers (as two hosts) loading one config see one persistent memory."""
    monkeypatch.setenv(PG_DSN_ENV, postgres_server.create_schema("cfg_manager"))
    path = tmp_path / "team.yaml"
    path.write_text(
        "version: 1\n"
        "store: {backend: postgres, pool: {min: 1, max: 2}, namespace: team}\n"
        "defaults: {retention: persistent, max_stored_messages: 3}\n"
    )
    assert load_config(path).store.backend == "postgres"
    with MemoryManager.from_config(path) as host_a, MemoryManager.from_config(path) as host_b:
        for i in range(5):
            host_a.memory("researcher").add(Message.user(f"m{i}"))
        assert type(host_b.store).__name__ == "PostgresStore"
        stored = host_b.store.load_messages(host_b.key("researcher"))
        assert [m.text for m in stored] == ["m2", "m3", "m4"]  # the bound, in the store


def test_manager_without_a_dsn_says_where_to_set_it(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(PG_DSN_ENV, raising=False)
    path = tmp_path / "team.yaml"
    path.write_text("version: 1\nstore: {backend: postgres}\n")
    with pytest.raises(ConfigError, match=PG_DSN_ENV):
        MemoryManager.from_config(path)
