"""Who may use the MCP server over HTTP: bearer tokens, each mapped to the agents it may touch.

A client sends ``Authorization: Bearer <token>`` (RFC 6750); :class:`TokenAuth` is the MCP
SDK's ``TokenVerifier`` for it, so the SDK's own middleware answers a missing or unknown
token with 401 before any tool runs, and binds each HTTP session to the client that opened
it. A token is compared in constant time (:func:`hmac.compare_digest` on SHA-256 digests,
against every client, whatever matches), and names one :class:`ClientGrant`: the agents
that client may read and write (names, ``prefix*``, or ``*`` for all). Tokens come from:

* a tokens file (``marsys-mem mcp --tokens FILE``; YAML, JSON or TOML, readable by its
  owner only)::

      clients:
        - {name: team-a, token: "<32+ characters>", agents: [researcher, planner]}
        - {name: ops, token: "<32+ characters>", agents: ["*"]}

* the environment variable ``MARSYS_MEM_MCP_TOKEN``: one client, ``env``, with every agent.

Make a token with ``python -c "import secrets; print(secrets.token_urlsafe(32))"``.

Example:
    >>> import asyncio
    >>> auth = TokenAuth([ClientGrant(name="team-a", token="t" * 32, agents=("researcher",))])
    >>> asyncio.run(auth.verify_token("t" * 32)).client_id
    'team-a'
    >>> asyncio.run(auth.verify_token("wrong")) is None
    True
    >>> auth.grant("team-a").allows("researcher"), auth.grant("team-a").allows("planner")
    (True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictStr,
    ValidationError,
    field_validator,
)

from marsys_mem.config.files import load_file
from marsys_mem.exceptions import ConfigError
from marsys_mem.model.names import validate_name

try:
    from mcp.server.auth.provider import AccessToken, TokenVerifier
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    from marsys_mem.exceptions import MissingDependencyError

    raise MissingDependencyError(
        "the MCP server needs the mcp extra: pip install 'marsys-mem[mcp]'"
    ) from exc

__all__ = ["TOKEN_ENV", "ClientGrant", "TokenAuth"]

TOKEN_ENV: Final = "MARSYS_MEM_MCP_TOKEN"  # noqa: S105 (a variable's name, not a token)
"""The environment variable holding one token for every agent (client name ``env``)."""

MIN_TOKEN_LENGTH: Final = 32
# RFC 6750 b64token: what may follow "Bearer " in an Authorization header
_BEARER_SYNTAX: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class ClientGrant(BaseModel):
    """One client of the MCP server: its name, its bearer token, and the agents it may use.

    ``agents`` holds agent names, ``prefix*`` (every agent whose name starts with
    ``prefix``) or ``*`` (every agent). The client may read and write those agents only.

    Example:
        >>> grant = ClientGrant(name="team-a", token="x" * 32, agents=("research-*",))
        >>> grant.allows("research-eu"), grant.allows("planner"), grant.everything
        (True, False, False)
        >>> grant
        ClientGrant(name='team-a', token=SecretStr('**********'), agents=('research-*',))
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: StrictStr = Field(description="the client's name (logs, errors)")
    token: SecretStr = Field(description=f"the bearer token (at least {MIN_TOKEN_LENGTH} chars)")
    agents: Annotated[
        tuple[StrictStr, ...], Field(min_length=1, description="names, prefix*, or *")
    ]

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name("name", value)

    @field_validator("token")
    @classmethod
    def _token(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value()
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"a token needs at least {MIN_TOKEN_LENGTH} characters, got {len(token)} "
                '(make one: python -c "import secrets; print(secrets.token_urlsafe(32))")'
            )
        if not _BEARER_SYNTAX.fullmatch(token):
            raise ValueError("a token holds only A-Z a-z 0-9 - . _ ~ + / (then = padding)")
        return value

    @field_validator("agents")
    @classmethod
    def _agents(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if pattern != "*":
                validate_name("agents", pattern.removesuffix("*"))
        return value

    @property
    def everything(self) -> bool:
        """Whether the client may use every agent (``*``)."""
        return "*" in self.agents

    def allows(self, agent: str) -> bool:
        """Whether the client may read and write ``agent``."""
        return any(
            p == "*" or p == agent or (p.endswith("*") and agent.startswith(p[:-1]))
            for p in self.agents
        )


class _TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clients: Annotated[list[ClientGrant], Field(min_length=1)]


class TokenAuth(TokenVerifier):
    """The MCP SDK ``TokenVerifier`` over a set of :class:`ClientGrant` (tokens in constant time).

    Args:
        clients: the clients; names and tokens must be unique.

    Raises:
        ConfigError: no clients, or two with one name or one token.

    Example:
        >>> import asyncio
        >>> auth = TokenAuth([ClientGrant(name="ops", token="o" * 32, agents=("*",))])
        >>> asyncio.run(auth.verify_token("o" * 32)).client_id, len(auth)
        ('ops', 1)
    """

    def __init__(self, clients: Iterable[ClientGrant]) -> None:
        self._clients: tuple[ClientGrant, ...] = tuple(clients)
        if not self._clients:
            raise ConfigError("MCP authentication needs at least one client token")
        names = [c.name for c in self._clients]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ConfigError(f"clients: two clients are named {dup!r}")
        self._digests = [_digest(c.token.get_secret_value()) for c in self._clients]
        if len(set(self._digests)) != len(self._digests):
            raise ConfigError("clients: two clients have the same token")
        self._by_name = {c.name: c for c in self._clients}

    def __len__(self) -> int:
        return len(self._clients)

    @property
    def clients(self) -> tuple[ClientGrant, ...]:
        """The clients, in the order given."""
        return self._clients

    def grant(self, name: str) -> ClientGrant:
        """The client named ``name`` (a ``KeyError`` for an unknown one)."""
        return self._by_name[name]

    def match(self, token: str) -> ClientGrant | None:
        """The client whose token is ``token``: every token is compared, in constant time."""
        given = _digest(token)
        found: ClientGrant | None = None
        for client, digest in zip(self._clients, self._digests, strict=True):
            if hmac.compare_digest(given, digest) and found is None:
                found = client
        return found

    async def verify_token(self, token: str) -> AccessToken | None:
        """The SDK's hook: the client's access, or ``None`` (the SDK answers 401)."""
        client = self.match(token)
        if client is None:
            return None
        # the token itself is not kept in the request's context: its digest names it
        return AccessToken(token=_digest(token).hex(), client_id=client.name, scopes=[])

    @classmethod
    def load(
        cls, tokens_file: str | Path | None = None, environ: Mapping[str, str] | None = None
    ) -> TokenAuth | None:
        """Clients from a tokens file and/or ``MARSYS_MEM_MCP_TOKEN``; ``None`` if neither.

        Raises:
            ConfigError: the file cannot be read, others may read it, or a client is
                invalid (the error names the file and the field); a bad environment token.
        """
        env = os.environ if environ is None else environ
        clients: list[ClientGrant] = []
        if tokens_file is not None:
            clients += _read_tokens_file(Path(tokens_file))
        token = env.get(TOKEN_ENV)
        if token is not None:
            try:
                clients.append(ClientGrant(name="env", token=SecretStr(token), agents=("*",)))
            except ValidationError as exc:
                raise ConfigError(f"{TOKEN_ENV}: {_first_error(exc)}") from None
        return cls(clients) if clients else None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False, include_input=False)[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def _errors(exc: ValidationError) -> Sequence[str]:
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in err["loc"])
        out.append(f"{loc}: {str(err['msg']).removeprefix('Value error, ')}")
    return out


def _read_tokens_file(path: Path) -> list[ClientGrant]:
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"tokens file {path}: {exc.strerror or exc}") from None
    if os.name == "posix" and stat.S_IMODE(mode) & 0o077:
        raise ConfigError(
            f"tokens file {path}: it holds secrets, so only its owner may read it "
            f"(mode {stat.S_IMODE(mode):o}); run: chmod 600 {path}"
        )
    data = load_file(path, what="tokens file").data
    try:
        return _TokensFile.model_validate(data).clients
    except ValidationError as exc:  # the messages name fields, never a token's value
        raise ConfigError(f"{path}: " + "; ".join(_errors(exc))) from None
