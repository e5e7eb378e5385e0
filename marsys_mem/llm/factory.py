"""Settings in, adapter out: the one place that turns an ``llm:`` section into an adapter.

A config file's ``llm:`` section (:class:`~marsys_mem.config.models.LLMConfig`) names a
``provider``, a ``model``, a ``base_url`` and the *name* of the environment variable holding
the key (``api_key_env``). :func:`make_llm` builds the adapter it describes
(:class:`~marsys_mem.llm.openai.OpenAILLM` for ``openai`` and ``azure``,
:class:`~marsys_mem.llm.anthropic.AnthropicLLM` for ``anthropic``), importing the SDK only
then, so the config layer never imports one. :func:`llm_problems` says, before anything
runs, what would stop it: the SDK extra is not installed, or the key's environment variable
is not set (each problem names the field to fix).

The settings are read by attribute (:class:`LLMSpec`): ``LLMConfig`` is one, and so is any
object with these attributes. Settings read from a file pass the trust boundary of
:mod:`marsys_mem.llm.trust` first (which key variable, sent to which server).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from marsys_mem.exceptions import LLMError
from marsys_mem.llm.trust import FileTrust, key_env, untrusted

if TYPE_CHECKING:
    from marsys_mem.llm.anthropic import AnthropicLLM
    from marsys_mem.llm.openai import OpenAILLM

__all__ = ["PROVIDERS", "LLMSpec", "llm_problems", "make_llm"]

PROVIDERS: dict[str, tuple[str, str]] = {
    "openai": ("marsys_mem.llm.openai", "openai"),
    "azure": ("marsys_mem.llm.openai", "openai"),
    "anthropic": ("marsys_mem.llm.anthropic", "anthropic"),
}
"""``provider -> (adapter module, the extra that installs its SDK)``."""


class LLMSpec(Protocol):
    """What :func:`make_llm` reads: the fields of an ``llm:`` section.

    Example:
        >>> from marsys_mem.config.models import LLMConfig
        >>> spec: LLMSpec = LLMConfig(model="llama3.2", base_url="http://localhost:11434/v1")
        >>> spec.provider
        'openai'
    """

    @property
    def provider(self) -> str:
        """``openai``, ``azure`` or ``anthropic``."""
        ...

    @property
    def model(self) -> str:
        """The model (Azure: the deployment)."""
        ...

    @property
    def base_url(self) -> str | None:
        """A compatible server, a gateway, or the Azure endpoint."""
        ...

    @property
    def api_key_env(self) -> str | None:
        """The name of the environment variable holding the key."""
        ...

    @property
    def api_version(self) -> str | None:
        """Azure's API version."""
        ...

    @property
    def timeout(self) -> float:
        """Seconds per HTTP attempt."""
        ...

    @property
    def max_retries(self) -> int:
        """Retries on 408/409/429/5xx, timeouts and connection errors."""
        ...

    @property
    def temperature(self) -> float | None:
        """Sampling temperature (``None``: the provider's default)."""
        ...

    @property
    def max_tokens(self) -> int | None:
        """Most tokens to generate (``None``: the provider's default)."""
        ...


def llm_problems(spec: LLMSpec, environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """What would stop :func:`make_llm`: ``(field, message)`` pairs, empty when none.

    The field is the one to fix: ``provider`` (its SDK extra is not installed) or
    ``api_key_env`` (the key's environment variable is not set or empty). Nothing is
    connected to. ``environ``: the environment to look in (default ``os.environ``).

    Example:
        >>> from marsys_mem.config.models import LLMConfig
        >>> cfg = LLMConfig(model="gpt-4o-mini", api_key_env="MY_KEY")
        >>> llm_problems(cfg, environ={})
        [('api_key_env', "environment variable 'MY_KEY' is not set (it holds the API key \
for provider 'openai'; set it, or name another variable with api_key_env)")]
        >>> llm_problems(cfg, environ={"MY_KEY": "sk-..."})
        []
    """
    env = os.environ if environ is None else environ
    found = PROVIDERS.get(spec.provider)
    if found is None:
        return [("provider", f"unknown provider {spec.provider!r}: one of {', '.join(PROVIDERS)}")]
    problems: list[tuple[str, str]] = []
    module, extra = found
    try:
        importlib.import_module(module)
    except ImportError as exc:
        problems.append(
            (
                "provider",
                f"provider {spec.provider!r} needs the {extra} SDK, which is not installed "
                f"(pip install 'marsys-mem[{extra}]'): {exc}",
            )
        )
    name = key_env(spec)
    if name is not None and not env.get(name):
        state = "is empty" if name in env else "is not set"
        problems.append(
            (
                "api_key_env",
                f"environment variable {name!r} {state} (it holds the API key for provider "
                f"{spec.provider!r}; set it, or name another variable with api_key_env)",
            )
        )
    return problems


def make_llm(
    spec: LLMSpec,
    environ: Mapping[str, str] | None = None,
    *,
    trust: FileTrust | None = None,
) -> OpenAILLM | AnthropicLLM:
    """The adapter ``spec`` describes, its key read from the environment (never a file).

    Only the variable :func:`~marsys_mem.llm.trust.key_env` names is read: an ``openai``
    server at a ``base_url`` without ``api_key_env`` gets no key (not even
    ``OPENAI_API_KEY``). Settings read from a file (``spec.source`` set, as
    :class:`~marsys_mem.config.models.LLMConfig` records) must pass the trust boundary
    (:func:`~marsys_mem.llm.trust.untrusted`) under ``trust`` (default: the user-level
    :meth:`FileTrust.from_env <marsys_mem.llm.trust.FileTrust.from_env>`); settings built in
    code are trusted code. Nothing is connected to until the first
    call; close it (``close`` / ``aclose`` or a ``with`` block) when done.

    Raises:
        LLMError: a problem :func:`llm_problems` finds (the SDK is missing, the key's
            environment variable is not set), or what a file may not do (a key variable
            or a server not allowed), naming the field; nothing was sent.

    Example:
        >>> from marsys_mem.config.models import LLMConfig
        >>> llm = make_llm(LLMConfig(model="llama3.2", base_url="http://localhost:11434/v1"))
        >>> llm.provider, llm.model
        ('openai', 'llama3.2')
        >>> llm.close()
    """
    env = os.environ if environ is None else environ
    source = getattr(spec, "source", None)
    refused: list[tuple[str, str]] = []
    if source is not None:  # read from a file: not trusted with secrets
        refused = untrusted(spec, FileTrust.from_env(env) if trust is None else trust)
    problems = refused or llm_problems(spec, env)
    if problems:
        raise LLMError(
            (f"{source}: " if refused else "")
            + "; ".join(f"llm.{field}: {message}" for field, message in problems),
            provider=spec.provider,
            model=spec.model,
            status=None,
        )
    name = key_env(spec)
    key = env[name] if name is not None else None
    if key is None and spec.provider == "openai":
        key = "unused"  # a base_url server: never the OPENAI_API_KEY the SDK would read
    if spec.provider == "anthropic":
        from marsys_mem.llm.anthropic import (  # noqa: PLC0415 (optional dependency: anthropic)
            DEFAULT_MAX_TOKENS,
            AnthropicLLM,
        )

        return AnthropicLLM(
            spec.model,
            base_url=spec.base_url,
            api_key=key,
            timeout=spec.timeout,
            max_retries=spec.max_retries,
            temperature=spec.temperature,
            max_tokens=spec.max_tokens or DEFAULT_MAX_TOKENS,
        )
    from marsys_mem.llm.openai import OpenAILLM  # noqa: PLC0415 (optional dependency: openai)

    if spec.provider == "azure":
        if spec.base_url is None or spec.api_version is None:
            raise LLMError(
                "llm: provider 'azure' needs base_url (the resource endpoint) and api_version",
                provider="azure",
                model=spec.model,
                status=None,
            )
        return OpenAILLM.azure(
            spec.model,
            endpoint=spec.base_url,
            api_version=spec.api_version,
            api_key=key,
            timeout=spec.timeout,
            max_retries=spec.max_retries,
            temperature=spec.temperature,
            max_tokens=spec.max_tokens,
        )
    return OpenAILLM(
        spec.model,
        base_url=spec.base_url,
        api_key=key,
        timeout=spec.timeout,
        max_retries=spec.max_retries,
        temperature=spec.temperature,
        max_tokens=spec.max_tokens,
    )
