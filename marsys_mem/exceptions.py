"""The one exception hierarchy of marsys-mem.

Every error the library raises on purpose derives from :class:`MarsysMemError`, and
subclasses the builtin that fits, so ``except ValueError`` keeps working. The tree below is
checked against the classes by ``tests/test_exceptions.py`` (each name drawn under its
parent, the builtins it also subclasses in parentheses)::

    MarsysMemError
    ├── ContextOverflowError (ValueError)        the budget cannot hold what must be kept
    ├── DuplicateMessageError (ValueError)       a message_id that is already in the memory
    ├── MessageNotFoundError (KeyError)          no message with that id
    ├── MessageFormatError (ValueError)          a provider dict that cannot become a Message
    ├── ToolSequenceError (ValueError)           tool calls and results that do not match
    │   ├── OrphanToolResultError                a tool result with no earlier tool call
    │   └── DuplicateToolCallError               a tool call id used twice
    ├── SummarizerError (RuntimeError)           the summariser failed or returned no text
    ├── ConfigError (ValueError)                 a bad retention-policy / config value
    │   ├── InvalidNameError                     a name (agent, branch, namespace) breaking the rule
    │   └── WorkflowError                        a workflow file that cannot run (file:line: field)
    ├── WorkflowRunError (RuntimeError)          a workflow step failed while running
    ├── StoreError (RuntimeError)                a storage backend failed
    │   ├── IndexCorruptError                    a vector index file is missing, stale or corrupt
    │   ├── InvalidDSNError (ValueError)         a database URL / conninfo that cannot be parsed
    │   └── StoreConnectionError (ConnectionError)  the database server cannot be reached or used
    │       └── DatabaseNotFoundError            the server has no database of that name
    ├── StoreNotFoundError (FileNotFoundError)   no store file at a path given to the CLI
    ├── ConflictError (RuntimeError)             a write lost a race with another writer
    ├── EmbeddingError (ValueError)              bad vectors (NaN, wrong dimension) or texts
    ├── MissingDependencyError (ImportError)     an optional extra is not installed
    ├── LLMError (RuntimeError)                  a model call failed (names provider, model, status)
    └── CoordinationError                        the coordination layer (marsys_mem.coordination)
        ├── BranchError (ValueError)             a branch-graph operation that cannot be done
        │   ├── UnknownBranchError               no branch with that name
        │   └── MergeCycleError                  a merge that would close a cycle
        ├── SignatureError (ValueError)          an unsigned, badly signed or stale payload
        └── TransportError (ConnectionError)     connecting, publishing or receiving failed
            └── AuthenticationError (PermissionError)  the broker refused the credentials

The coordination errors are also importable from :mod:`marsys_mem.coordination` (and from
the modules that raise them, ``coordination.transport`` and ``coordination.signing``).
Pydantic's own ``ValidationError`` (a ``ValueError``) is raised unchanged for bad fields
of a model: it already names the field and the value.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "AuthenticationError",
    "BranchError",
    "ConfigError",
    "ConflictError",
    "ContextOverflowError",
    "CoordinationError",
    "DatabaseNotFoundError",
    "DuplicateMessageError",
    "DuplicateToolCallError",
    "EmbeddingError",
    "IndexCorruptError",
    "InvalidDSNError",
    "InvalidNameError",
    "LLMError",
    "MarsysMemError",
    "MergeCycleError",
    "MessageFormatError",
    "MessageNotFoundError",
    "MissingDependencyError",
    "OrphanToolResultError",
    "SignatureError",
    "SignatureReason",
    "StoreConnectionError",
    "StoreError",
    "StoreNotFoundError",
    "SummarizerError",
    "ToolSequenceError",
    "TransportError",
    "UnknownBranchError",
    "WorkflowError",
    "WorkflowRunError",
]


class MarsysMemError(Exception):
    """Root of every error raised on purpose by marsys-mem."""


class ContextOverflowError(MarsysMemError, ValueError):
    """The messages that must be kept do not fit the context budget.

    Attributes:
        required: what the messages that must be kept need (tokens or messages).
        limit: the limit of the policy.
        unit: ``"tokens"`` or ``"messages"``.
        over: ``required - limit``.
    """

    def __init__(self, message: str, *, required: int, limit: int, unit: str) -> None:
        super().__init__(message)
        self.required = required
        self.limit = limit
        self.unit = unit
        self.over = required - limit


class DuplicateMessageError(MarsysMemError, ValueError):
    """A message with the same ``message_id`` is already in the memory."""


class MessageNotFoundError(MarsysMemError, KeyError):
    """No message with the given id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "message not found"


class MessageFormatError(MarsysMemError, ValueError):
    """A provider message dict that cannot be turned into a :class:`Message`."""


class ToolSequenceError(MarsysMemError, ValueError):
    """Tool calls and tool results that do not pair up."""


class OrphanToolResultError(ToolSequenceError):
    """A tool result whose ``tool_call_id`` matches no earlier tool call."""


class DuplicateToolCallError(ToolSequenceError):
    """A tool call id used by two calls, or answered twice."""


class SummarizerError(MarsysMemError, RuntimeError):
    """The summariser raised or returned something that is not text."""


class ConfigError(MarsysMemError, ValueError):
    """A configuration file or value is invalid; the message names file and field."""


class InvalidNameError(ConfigError):
    """An agent, branch or namespace name that breaks the one naming rule.

    The rule (:mod:`marsys_mem.model.names`): 1-256 characters of valid Unicode, without ``/``,
    ``+``, ``#``, ``@``, control or invisible (zero-width, bidi) characters. The message
    names the kind of name and
    shows the value (truncated). It is a :class:`ConfigError` (a ``ValueError``).

    Example:
        >>> from marsys_mem.model.names import validate_name
        >>> try:
        ...     validate_name("branch", "main#rag")
        ... except InvalidNameError as exc:
        ...     print(str(exc).split(", got ")[1])
        'main#rag' (it contains '#')
    """


class StoreError(MarsysMemError, RuntimeError):
    """A storage backend failed; the original error is chained as ``__cause__``."""


class ConflictError(MarsysMemError, RuntimeError):
    """A write lost a race: what it was based on changed before it could commit.

    Nothing of the write was stored. Raised by a store batch whose
    :class:`~marsys_mem.store.base.ExpectLast` does not hold, and by the LangGraph
    checkpointer when another writer extended a thread this run had read (the message
    names the thread and what to do: run again from the latest state).
    """


class IndexCorruptError(StoreError):
    """A saved vector index cannot be used (missing, stale or failing its checksum)."""


class InvalidDSNError(StoreError, ValueError):
    """A database URL or conninfo string that cannot be parsed (the password is never shown)."""


class StoreConnectionError(StoreError, ConnectionError):
    """The database server cannot be reached, refuses the login, or stayed away too long.

    The message names the server (host, port, database, user; never the password) and
    what failed: a refused connection, a timeout, an authentication failure.
    """


class DatabaseNotFoundError(StoreConnectionError):
    """The server answered, but has no database of the name the DSN gives."""


class EmbeddingError(MarsysMemError, ValueError):
    """Vectors or texts that cannot be embedded or indexed (NaN, wrong dimension, empty)."""


class MissingDependencyError(MarsysMemError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class LLMError(MarsysMemError, RuntimeError):
    """A model call failed: HTTP status, timeout, connection, refusal or invalid output.

    The message names the provider, the model and the HTTP status (when there was one);
    the SDK's own error is chained as ``__cause__``.

    Attributes:
        provider: ``"openai"``, ``"azure"``, ``"anthropic"`` or the name an adapter was given.
        model: the model name sent to the provider.
        status: the HTTP status code, or ``None`` (timeout, connection, invalid output).

    Example:
        >>> err = LLMError("openai model 'gpt-4o-mini': HTTP 429: rate limited",
        ...                provider="openai", model="gpt-4o-mini", status=429)
        >>> err.status, isinstance(err, RuntimeError)
        (429, True)
    """

    def __init__(self, message: str, *, provider: str, model: str, status: int | None) -> None:
        super().__init__(message)
        self.provider = provider
        self.model = model
        self.status = status


class WorkflowError(ConfigError):
    """A workflow that cannot run: a bad field, an unknown agent or branch, a merge cycle.

    The message names the file, the line and the field (when the workflow came from a
    file). It is a :class:`ConfigError` (a ``ValueError``).

    Example:
        >>> err = WorkflowError("wf.yaml:14: steps[3].agent: unknown agent 'resercher'")
        >>> isinstance(err, ConfigError), isinstance(err, ValueError)
        (True, True)
    """


class WorkflowRunError(MarsysMemError, RuntimeError):
    """A step failed while the workflow ran (the message names the file, line and step).

    The cause (``__cause__``) is the original error.

    Example:
        >>> issubclass(WorkflowRunError, RuntimeError)
        True
    """


class StoreNotFoundError(MarsysMemError, FileNotFoundError):
    """The path is not a store file, nor a folder holding one.

    Example:
        >>> issubclass(StoreNotFoundError, FileNotFoundError)
        True
    """


# ---------------------------------------------------------------------------- coordination
class CoordinationError(MarsysMemError):
    """Root of the coordination layer's errors (branch graph, transports, signing, coordinator).

    Example:
        >>> issubclass(TransportError, CoordinationError), issubclass(BranchError, ValueError)
        (True, True)
    """


class BranchError(CoordinationError, ValueError):
    """A branch-graph operation that cannot be done; nothing was changed."""


class UnknownBranchError(BranchError):
    """No branch with that name in the graph."""


class MergeCycleError(BranchError):
    """A merge that would close a cycle (see ``BranchGraph.check_merge``)."""


SignatureReason = Literal["unsigned", "bad_signature", "stale", "replayed"]
"""Why a payload failed verification (:attr:`SignatureError.reason`)."""


class SignatureError(CoordinationError, ValueError):
    """A payload that is not signed, or not signed by a key this signer knows.

    Attributes:
        reason: ``"unsigned"`` (no ``mm2.`` header), ``"bad_signature"`` (a header
            whose key id is unknown or whose MAC does not match the topic and body),
            ``"stale"`` (signed outside the receiver's replay window) or ``"replayed"``
            (a copy of a payload already accepted).

    Example:
        >>> SignatureError("no header on 'marsys/t/x'", reason="unsigned").reason
        'unsigned'
    """

    def __init__(self, message: str, *, reason: SignatureReason) -> None:
        super().__init__(message)
        self.reason: SignatureReason = reason


class TransportError(CoordinationError, ConnectionError):
    """Connecting, publishing or receiving failed; the cause is chained as ``__cause__``."""


class AuthenticationError(TransportError, PermissionError):
    """The broker refused the client's credentials (bad username/password, not authorised)."""
