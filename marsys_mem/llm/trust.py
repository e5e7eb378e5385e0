"""Which API key a file may read, and where it may send it: the trust boundary for files.

An ``llm:`` section read from a file (a workflow or a retention-policy file) names the
*environment variable* holding the key (``api_key_env``) and the server it goes to
(``base_url``). A file is data, not code: it must not pick a secret and an address for it.
So a setting that came from a file may use, without being allowed:

- the provider's standard variable (:data:`STANDARD_KEY_ENV`: ``OPENAI_API_KEY``,
  ``ANTHROPIC_API_KEY``, ``AZURE_OPENAI_API_KEY``);
- any ``base_url`` when no key is sent (an ``openai`` server without ``api_key_env``:
  Ollama, vLLM on loopback), and the provider's own API with a key.

Anything else is allowed by the user, outside the file (:class:`FileTrust`): the
``--allow-env NAME`` / ``--allow-base-url URL`` options of ``marsys-mem run`` and
``validate``, or the environment variables ``MARSYS_MEM_ALLOW_ENV=NAME1,NAME2`` and
``MARSYS_MEM_ALLOW_BASE_URL=URL1,URL2``. A base URL is allowed by its origin
(scheme, host and port). Settings built in Python (an ``LLMConfig`` made in code) are
trusted code: the boundary applies to what a file says (``LLMConfig.source`` is set).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "ALLOW_BASE_URL_ENV",
    "ALLOW_ENV_ENV",
    "STANDARD_KEY_ENV",
    "FileTrust",
    "KeySpec",
    "key_env",
    "origin",
    "untrusted",
]

ALLOW_ENV_ENV = "MARSYS_MEM_ALLOW_ENV"
"""The user-level setting: key variables files may name, comma-separated."""

ALLOW_BASE_URL_ENV = "MARSYS_MEM_ALLOW_BASE_URL"
"""The user-level setting: servers files may send a key to, comma-separated."""

STANDARD_KEY_ENV: dict[str, str] = {
    "openai": "OPENAI_API_KEY",
    "azure": "AZURE_OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}
"""``provider -> the variable its SDK reads``: what a file may use without being allowed."""

_OWN_API = {"openai": "https://api.openai.com", "anthropic": "https://api.anthropic.com"}
_AZURE_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class KeySpec(Protocol):
    """The fields of an ``llm:`` section the boundary reads (``LLMConfig`` is one)."""

    @property
    def provider(self) -> str:
        """``openai``, ``azure`` or ``anthropic``."""
        ...

    @property
    def base_url(self) -> str | None:
        """The server the key goes to (``None``: the provider's own API)."""
        ...

    @property
    def api_key_env(self) -> str | None:
        """The name of the environment variable holding the key."""
        ...


def key_env(spec: KeySpec) -> str | None:
    """The environment variable the key is read from; ``None`` when no key is sent.

    ``api_key_env`` when set; else the provider's standard variable, except for
    ``openai`` with a ``base_url`` (local OpenAI-compatible servers ignore the key: none
    is sent; name ``api_key_env`` to send one).

    Example:
        >>> from marsys_mem.config.models import LLMConfig
        >>> key_env(LLMConfig(provider="anthropic", model="claude-haiku-4-5"))
        'ANTHROPIC_API_KEY'
        >>> key_env(LLMConfig(model="llama3.2", base_url="http://localhost:11434/v1")) is None
        True
    """
    if spec.api_key_env is not None:
        return spec.api_key_env
    if spec.provider == "openai" and spec.base_url:
        return None
    return STANDARD_KEY_ENV.get(spec.provider)


def origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, lower-cased: what a base URL is allowed by.

    Example:
        >>> origin("HTTP://Gateway.example:8080/v1/")
        'http://gateway.example:8080'
    """
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    if ":" in host:  # IPv6
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # a port out of range: keep what was written
        port = ":" + parts.netloc.rsplit(":", 1)[-1]
    return f"{parts.scheme.lower()}://{host}{port}"


def _own_api(provider: str, url: str) -> bool:
    """Whether ``url`` is the provider's own API (Azure: an Azure OpenAI resource)."""
    if provider == "azure":
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        return parts.scheme == "https" and host.endswith(_AZURE_HOSTS)
    own = _OWN_API.get(provider)
    return own is not None and origin(url) == own


def _split(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


class FileTrust(BaseModel):
    """What the user allows files to use, beyond the standard key variables.

    ``allow_env``: key variables a file may name (``--allow-env``, ``MARSYS_MEM_ALLOW_ENV``);
    ``allow_base_url``: servers a file may send a key to, by origin
    (``--allow-base-url``, ``MARSYS_MEM_ALLOW_BASE_URL``). Set by the user, never by a
    file.

    Example:
        >>> trust = FileTrust.from_env({"MARSYS_MEM_ALLOW_ENV": "TEAM_KEY, OTHER_KEY"})
        >>> sorted(trust.allow_env)
        ['OTHER_KEY', 'TEAM_KEY']
        >>> trust = trust.allowing(base_urls=["https://gateway.example/v1"])
        >>> trust.allows_url("https://gateway.example/other"), trust.allows_url("http://x")
        (True, False)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow_env: frozenset[str] = Field(default_factory=frozenset)
    allow_base_url: frozenset[str] = Field(default_factory=frozenset)

    @field_validator("allow_env")
    @classmethod
    def _names(cls, value: frozenset[str]) -> frozenset[str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(
                    f"not an environment variable name: {name!r} (letters, digits and _)"
                )
        return value

    @field_validator("allow_base_url")
    @classmethod
    def _origins(cls, value: frozenset[str]) -> frozenset[str]:
        out = set()
        for url in value:
            if not re.match(r"^https?://[^/\s]+", url.strip()):
                raise ValueError(f"not an http(s) URL: {url!r} (like https://gateway.example)")
            out.add(origin(url))
        return frozenset(out)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FileTrust:
        """The user-level setting: ``MARSYS_MEM_ALLOW_ENV`` and ``MARSYS_MEM_ALLOW_BASE_URL``.

        Raises:
            ValueError: a name or URL in them is malformed (naming the variable).
        """
        env = os.environ if environ is None else environ
        return cls._made(
            _split(env.get(ALLOW_ENV_ENV)),
            _split(env.get(ALLOW_BASE_URL_ENV)),
            (ALLOW_ENV_ENV, ALLOW_BASE_URL_ENV),
        )

    def allowing(self, env: Iterable[str] = (), base_urls: Iterable[str] = ()) -> FileTrust:
        """This trust with more variables and servers allowed (``--allow-env`` options).

        Raises:
            ValueError: a name or URL is malformed (naming the option).
        """
        return self._made(
            [*self.allow_env, *env],
            [*self.allow_base_url, *base_urls],
            ("--allow-env", "--allow-base-url"),
        )

    @classmethod
    def _made(cls, env: list[str], urls: list[str], names: tuple[str, str]) -> FileTrust:
        try:
            return cls(allow_env=frozenset(env), allow_base_url=frozenset(urls))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            name = names[0] if err["loc"][0] == "allow_env" else names[1]
            raise ValueError(f"{name}: {str(err['msg']).removeprefix('Value error, ')}") from None

    def allows_url(self, url: str) -> bool:
        """Whether a key may be sent to ``url`` (its origin is allowed)."""
        return origin(url) in self.allow_base_url


def untrusted(spec: KeySpec, trust: FileTrust) -> list[tuple[str, str]]:
    """What a file's ``llm:`` section may not do under ``trust``: ``(field, message)`` pairs.

    ``api_key_env``: a variable other than the provider's standard one, not allowed;
    ``base_url``: a key would be sent to a server other than the provider's own API,
    not allowed. Each message says how to allow it. Empty: nothing to refuse.

    Example:
        >>> from marsys_mem.config.models import LLMConfig
        >>> spec = LLMConfig(model="m", base_url="http://evil.example/v1",
        ...                  api_key_env="AWS_SECRET_ACCESS_KEY")
        >>> [field for field, _ in untrusted(spec, FileTrust())]
        ['api_key_env', 'base_url']
        >>> trust = FileTrust(allow_env={"AWS_SECRET_ACCESS_KEY"},
        ...                   allow_base_url={"http://evil.example"})
        >>> untrusted(spec, trust)
        []
        >>> untrusted(LLMConfig(model="llama3.2", base_url="http://localhost:11434/v1"),
        ...           FileTrust())
        []
    """
    out: list[tuple[str, str]] = []
    name = key_env(spec)
    if name is None:
        return out
    standard = STANDARD_KEY_ENV.get(spec.provider)
    if name != standard and name not in trust.allow_env:
        out.append(
            (
                "api_key_env",
                f"the file asks for the API key in environment variable {name!r}; a file may "
                f"only use {standard!r} for provider {spec.provider!r} unless you allow "
                f"{name!r}: pass --allow-env {name} or set {ALLOW_ENV_ENV}={name}",
            )
        )
    url = spec.base_url
    if url and not _own_api(spec.provider, url) and not trust.allows_url(url):
        site = origin(url)
        out.append(
            (
                "base_url",
                f"the API key (${name}) would be sent to {site}, not {spec.provider}'s own "
                f"API; if you trust that server, pass --allow-base-url {site} or set "
                f"{ALLOW_BASE_URL_ENV}={site}",
            )
        )
    return out
