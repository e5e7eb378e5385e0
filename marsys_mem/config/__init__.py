"""The memory configuration format and the one bounded reader for YAML, TOML and JSON files.

``load_config`` reads a retention-policy file into a validated ``MemoryConfig``; errors name
the file, the line and the field.
"""

from marsys_mem.config.coordination import CoordinatorSettings
from marsys_mem.config.load import ConfigFile, load_config, load_config_file
from marsys_mem.config.models import (
    AgentConfig,
    MemoryConfig,
    RetentionPolicy,
    StoreConfig,
    parse_duration,
)

__all__ = [
    "AgentConfig",
    "ConfigFile",
    "CoordinatorSettings",
    "MemoryConfig",
    "RetentionPolicy",
    "StoreConfig",
    "load_config",
    "load_config_file",
    "parse_duration",
]
