"""The trust boundary for workflow and policy files: keys, servers and store paths.

A file is data: it does not choose which secret is read, where it is sent, or where data
is written outside its own folder. For what a file says:

- ``llm:``: the key's variable and the server it goes to must pass
  :func:`marsys_mem.llm.trust.untrusted` (the provider's standard variable; a key only to
  the provider's own API) unless the user allows more (:class:`~marsys_mem.llm.trust.FileTrust`:
  ``--allow-env``, ``--allow-base-url``, ``MARSYS_MEM_ALLOW_ENV``,
  ``MARSYS_MEM_ALLOW_BASE_URL``). ``validate`` reports what is not allowed (warnings);
  ``run`` refuses it before anything is sent or written.
- ``store.path``: a SQLite file outside the folder of the file that names it (resolved,
  symlinks followed) is a warning (:func:`store_warning`); ``--strict`` makes it an error.

A :class:`~marsys_mem.workflow.Workflow` built in Python is trusted code: only the files
it was read from (or that it refers to) are checked.
"""

from __future__ import annotations

from pathlib import Path

from marsys_mem.config.models import LLMConfig, StoreConfig
from marsys_mem.llm.trust import FileTrust, key_env, origin, untrusted

__all__ = ["llm_findings", "llm_route", "store_warning"]


def store_warning(store: StoreConfig, folder: Path, where: str) -> str | None:
    """A warning when ``store``'s SQLite file lies outside ``folder``, else ``None``.

    ``folder`` is the folder of the file that names the path; ``where`` locates the
    field (``wf.yaml:3: memory.store.path``). The path is resolved against ``folder``,
    with ``~`` expanded and symlinks followed.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> store_warning(StoreConfig(backend="sqlite", path="mem.db"), folder, "x") is None
        True
        >>> store_warning(StoreConfig(backend="sqlite", path="../x.db"), folder, "p.yaml:2: "
        ...               "store.path").split(": the store")[0]
        'p.yaml:2: store.path'
    """
    if store.backend != "sqlite" or store.path is None:
        return None
    home = folder.resolve()
    target = store.resolved_path(home).resolve()
    if target.is_relative_to(home):
        return None
    return (
        f"{where}: the store {str(target)!r} is outside the file's folder {str(home)!r}; "
        "a file should not choose where data is written outside its folder (use a path "
        "under it, or give the store with --store DIR); an error with --strict"
    )


def llm_findings(llm: LLMConfig | None, trust: FileTrust, where: dict[str, str]) -> list[str]:
    """What a file's ``llm:`` may not do under ``trust``, one line each (none: ``[]``).

    Only a section read from a file (``llm.source`` set) is checked: one built in code is
    trusted. ``where`` maps a field (``api_key_env``, ``base_url``) to its location in the
    file (``wf.yaml:5: llm.api_key_env``).

    Example:
        >>> spec = LLMConfig.model_validate(
        ...     {"model": "m", "base_url": "http://evil.example/v1", "api_key_env": "AWS_KEY"},
        ...     context={"source": "/tmp/wf.yaml"})
        >>> where = {"api_key_env": "wf.yaml:4: llm.api_key_env"}
        >>> findings = llm_findings(spec, FileTrust(), where)
        >>> findings[0].split(": the file")[0], len(findings)
        ('wf.yaml:4: llm.api_key_env', 2)
    """
    if llm is None or llm.source is None:
        return []
    return [
        f"{where.get(field, f'{llm.source}: llm.{field}')}: {message}"
        for field, message in untrusted(llm, trust)
    ]


def llm_route(llm: LLMConfig | None) -> str:
    """Where the model's key goes, for ``validate``'s summary (``""``: no model).

    Example:
        >>> llm_route(LLMConfig(model="m", base_url="http://127.0.0.1:8765/v1"))
        'openai:m at http://127.0.0.1:8765, no key'
        >>> llm_route(LLMConfig(provider="anthropic", model="claude-x"))
        'anthropic:claude-x, key $ANTHROPIC_API_KEY'
    """
    if llm is None:
        return ""
    name = key_env(llm)
    at = f" at {origin(llm.base_url)}" if llm.base_url else ""
    return f"{llm.provider}:{llm.model}{at}, " + (f"key ${name}" if name else "no key")
