import importlib
import pkgutil
import subprocess
import sys

import pytest

import marsys_mem

# The narrowed top level: what the quickstart and the guides' first pages import. A name
# added here is a decision (and a docs change), not a side effect of an import.
TOP_LEVEL = {
    "AgentConfig",
    "ContextPolicy",
    "ContextWindow",
    "ConversationMemory",
    "HeuristicCounter",
    "InMemoryStore",
    "MarsysMemError",
    "Memory",
    "MemoryConfig",
    "MemoryManager",
    "MemoryStore",
    "Message",
    "RetentionPolicy",
    "SQLiteStore",
    "StoreConfig",
    "ToolCall",
    "Workflow",
    "WorkflowReport",
    "__version__",
    "arun_workflow",
    "load_config",
    "load_workflow",
    "run_workflow",
}

# Everything else the top level used to export, and its one public home now.
HOMES = {
    "marsys_mem.config": ["parse_duration"],
    "marsys_mem.context": [
        "CallableCounter",
        "ExtractiveSummarizer",
        "Strategy",
        "Summarizer",
        "TiktokenCounter",
        "TokenCounter",
        "abuild_context",
        "build_context",
        "count_message",
        "get_counter",
    ],
    "marsys_mem.exceptions": [
        "ConfigError",
        "ConflictError",
        "ContextOverflowError",
        "DuplicateMessageError",
        "DuplicateToolCallError",
        "EmbeddingError",
        "IndexCorruptError",
        "InvalidNameError",
        "MessageFormatError",
        "MessageNotFoundError",
        "MissingDependencyError",
        "OrphanToolResultError",
        "StoreError",
        "StoreNotFoundError",
        "SummarizerError",
        "ToolSequenceError",
        "WorkflowError",
        "WorkflowRunError",
    ],
    "marsys_mem.model": [
        "AddEvent",
        "AgentCall",
        "ClearEvent",
        "EventBus",
        "ForkEvent",
        "ImagePart",
        "MESSAGE_LIST_ADAPTER",
        "MemoryEvent",
        "RemoveEvent",
        "Role",
        "RunContext",
        "RunSnapshot",
        "SharedFact",
        "SummarizeEvent",
        "TextPart",
        "TrimEvent",
        "WindowEvent",
        "history",
        "to_llm_format",
        "validate_name",
    ],
    "marsys_mem.retrieval": [
        "Embedder",
        "EmbeddingQueue",
        "FaissIndex",
        "HashingEmbedder",
        "SentenceTransformerEmbedder",
        "VectorIndex",
        "default_embedder",
    ],
}

# Re-exports of names defined elsewhere, removed (0.1.0: no compatibility shims).
REMOVED = [
    ("marsys_mem.context.window", "ContextPolicy"),
    ("marsys_mem.context.window", "ContextWindow"),
    ("marsys_mem.context.window", "StartOn"),
    ("marsys_mem.context.window", "Strategy"),
    ("marsys_mem.context.window", "Summarizer"),
    ("marsys_mem.context.window", "is_user_turn"),
    ("marsys_mem.context", "is_user_turn"),
    ("marsys_mem.coordination.transport", "BranchError"),
    ("marsys_mem.coordination.transport", "fact_topic"),
    ("marsys_mem.coordination.transport", "validate_name"),
    ("marsys_mem.coordination.signing", "SignatureError"),
    ("marsys_mem.coordination.envelope", "inbox_key"),
    ("marsys_mem.coordination", "inbox_key"),
    ("marsys_mem.coordination", "TransportError"),
    ("marsys_mem.coordination", "UnknownBranchError"),
    ("marsys_mem.patterns", "member_key"),
    ("marsys_mem.patterns.shared", "member_key"),
    ("marsys_mem.patterns.hierarchical", "default_importance"),
    ("marsys_mem.workflow.models", "WorkflowError"),
    ("marsys_mem.workflow.models", "WorkflowRunError"),
    ("marsys_mem.llm.factory", "key_env"),
    ("marsys_mem.cli.inspect", "StoreNotFoundError"),
]


def test_top_level_is_exactly_the_narrow_set():
    assert set(marsys_mem.__all__) == TOP_LEVEL
    assert len(marsys_mem.__all__) == len(TOP_LEVEL)  # no duplicates


def test_every_top_level_name_imports():
    for name in TOP_LEVEL:
        assert getattr(marsys_mem, name) is not None, name
    code = f"from marsys_mem import {', '.join(sorted(TOP_LEVEL))}"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("home", sorted(HOMES))
def test_moved_names_live_in_their_home(home):
    module = importlib.import_module(home)
    for name in HOMES[home]:
        assert name in module.__all__, f"{home}.{name}"
        assert getattr(module, name) is not None
        assert name not in marsys_mem.__all__
        assert not hasattr(marsys_mem, name), f"marsys_mem.{name} is still there"


def test_every_exception_but_the_base_lives_in_exceptions():
    import marsys_mem.exceptions as exceptions

    errors = {n for n in exceptions.__all__ if n.endswith("Error")}
    assert len(errors) > 20
    assert {n for n in marsys_mem.__all__ if n.endswith("Error")} == {"MarsysMemError"}


@pytest.mark.parametrize(("module", "name"), REMOVED)
def test_compatibility_shims_are_gone(module, name):
    mod = importlib.import_module(module)
    assert name not in mod.__all__


def test_one_helper_calls_sync_or_async_callables():
    """No module but marsys_mem.callables tells sync from async callables by hand."""
    import os
    import pathlib

    root = pathlib.Path(marsys_mem.__file__).parent
    sources = [
        pathlib.Path(folder, name)
        for folder, _, names in os.walk(root, followlinks=True)  # patterns/, coordination/
        for name in names
        if name.endswith(".py")
    ]
    assert any("coordination" in p.parts for p in sources)
    offenders = [
        str(p.relative_to(root))
        for p in sources
        if p.name != "callables.py" and "iscoroutinefunction" in p.read_text()
    ]
    assert offenders == []


def test_all_is_sorted_and_complete():
    names = marsys_mem.__all__

    # isort-style order (ruff RUF022): CONSTANTS, then Classes, then functions
    def key(n: str) -> tuple[int, str]:
        return (0 if n.isupper() else 1 if n[:1].isupper() else 2, n)

    assert list(names) == sorted(names, key=key)
    public = {n for n in vars(marsys_mem) if not n.startswith("_")} - {
        "annotations",
    }
    modules = {n for n in public if type(getattr(marsys_mem, n)).__name__ == "module"}
    assert set(names) | {"__version__"} >= public - modules
    for name in names:
        assert hasattr(marsys_mem, name), name


def test_every_module_has_explicit_all():
    modules = [
        info.name
        for info in pkgutil.walk_packages(marsys_mem.__path__, "marsys_mem.")
        if info.name != "marsys_mem.__main__"
    ]
    assert len(modules) > 50
    for name in modules:
        module = importlib.import_module(name)
        assert isinstance(getattr(module, "__all__", None), list), name
        for export in module.__all__:
            assert hasattr(module, export), f"{name}.{export}"


def test_symlinked_subpackages_install_under_marsys_mem():
    import marsys_mem.coordination as coordination
    import marsys_mem.patterns as patterns

    assert patterns.__name__ == "marsys_mem.patterns"
    assert coordination.__name__ == "marsys_mem.coordination"


def test_lower_layers_load_without_workflow_or_cli():
    code = (
        "import sys, marsys_mem.patterns, marsys_mem.coordination, marsys_mem.store;"
        "top = ('marsys_mem.workflow', 'marsys_mem.cli');"
        "loaded = [m for m in sys.modules if m.startswith(top)];"
        "assert not loaded, loaded;"
        "from marsys_mem import run_workflow, Workflow;"
        "assert 'marsys_mem.workflow' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
