"""How the MCP server is exposed over HTTP: the address, the allowed Hosts and Origins, auth.

The rules (the MCP specification's security guidance for streamable HTTP):

* **Authentication off loopback.** A server bound to anything but a loopback address
  (``127.0.0.0/8``, ``::1``, ``localhost``) without bearer tokens refuses to start
  (:meth:`HttpSettings.check`); ``insecure=True`` (``--insecure``) overrides, with a
  warning.
* **DNS rebinding.** Every request's ``Host`` must be an allowed host and its ``Origin``
  (when sent) an allowed origin, whatever the bind address; otherwise the SDK answers 421
  or 403. Allowed by default: the loopback names (any port) and the literal bind address;
  a real deployment adds its public names (``allowed_hosts``, ``--allow-host``) and the
  browser origins it serves (``allowed_origins``, ``--allow-origin``).

Example:
    >>> s = HttpSettings(host="0.0.0.0", port=8000, allowed_hosts=("mem.example.com",))
    >>> s.loopback, s.url
    (False, 'http://0.0.0.0:8000/mcp')
    >>> s.transport_security().allowed_hosts[-2:]
    ['mem.example.com', 'mem.example.com:*']
    >>> s.check(authenticated=False)
    Traceback (most recent call last):
    ...
    marsys_mem.exceptions.ConfigError: refusing to serve MCP on 0.0.0.0:8000 without ...
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from marsys_mem.exceptions import ConfigError

try:
    from mcp.server.transport_security import TransportSecuritySettings
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    from marsys_mem.exceptions import MissingDependencyError

    raise MissingDependencyError(
        "the MCP server needs the mcp extra: pip install 'marsys-mem[mcp]'"
    ) from exc

__all__ = ["HttpSettings"]

_LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "[::1]")
_PATH: Final = "/mcp"


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    """``host`` as it appears in a URL or a Host header (IPv6 in brackets)."""
    try:
        if ipaddress.ip_address(host.strip("[]")).version == 6:
            return f"[{host.strip('[]')}]"
    except ValueError:
        pass
    return host


def _has_port(host: str) -> bool:
    """Whether a Host value names its port (``name:8000``, ``[::1]:8000``)."""
    if host.startswith("["):
        return "]:" in host
    return host.count(":") == 1


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


class HttpSettings(BaseModel):
    """Where and how the MCP server listens over HTTP (validated; frozen).

    Args:
        host: the bind address (default ``127.0.0.1``).
        port: the port (0: any free port).
        allowed_hosts: more ``Host`` header values to accept (``name`` accepts any
            port; ``name:port`` only that one).
        allowed_origins: more ``Origin`` values to accept (``https://app.example.com``).
        insecure: serve off loopback without authentication (a warning, never a default).

    Example:
        >>> HttpSettings().transport_security().allowed_hosts
        ['127.0.0.1:*', 'localhost:*', '[::1]:*', '127.0.0.1', 'localhost', '[::1]']
        >>> HttpSettings(port=-1)
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for HttpSettings...
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: Annotated[StrictStr, Field(min_length=1, max_length=253)] = "127.0.0.1"
    port: Annotated[int, Field(strict=True, ge=0, le=65535)] = 8000
    allowed_hosts: tuple[StrictStr, ...] = ()
    allowed_origins: tuple[StrictStr, ...] = ()
    insecure: Annotated[bool, Field(strict=True)] = False

    @field_validator("allowed_hosts", "allowed_origins")
    @classmethod
    def _no_blank(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not item.strip() or any(c.isspace() or ord(c) < 32 for c in item):
                raise ValueError(f"{item!r} is not a host or origin")
            if item.count(":") > 1 and not item.startswith(("[", "http")):
                raise ValueError(f"{item!r}: write an IPv6 host in brackets ([::1])")
            if item.endswith("/"):
                raise ValueError(f"{item!r}: an origin has no path (drop the trailing /)")
        return value

    @property
    def loopback(self) -> bool:
        """Whether the server binds a loopback address only."""
        return _is_loopback(self.host)

    @property
    def url(self) -> str:
        """The server's MCP endpoint, as bound."""
        return f"http://{_url_host(self.host)}:{self.port}{_PATH}"

    def check(self, *, authenticated: bool) -> str | None:
        """Refuse an unauthenticated server off loopback; the warning ``insecure`` earns.

        Returns:
            The warning to print (``insecure`` off loopback without auth), else ``None``.

        Raises:
            ConfigError: off loopback, no authentication, and not ``insecure``.
        """
        if authenticated or self.loopback:
            return None
        where = f"{self.host}:{self.port}"
        if not self.insecure:
            raise ConfigError(
                f"refusing to serve MCP on {where} without authentication: anyone who "
                "reaches it could read and forget every agent's memory. Give tokens "
                "(--tokens FILE or MARSYS_MEM_MCP_TOKEN), bind 127.0.0.1, or pass "
                "--insecure to serve it open anyway"
            )
        return (
            f"WARNING: --insecure: serving MCP on {where} WITHOUT AUTHENTICATION: anyone "
            "who can reach this address can read, change and forget every agent's memory"
        )

    def transport_security(self) -> TransportSecuritySettings:
        """The SDK's DNS-rebinding protection for these settings (always on)."""
        names = list(_LOOPBACK_HOSTS)
        if not self.loopback and not _is_wildcard(self.host):
            names.append(_url_host(self.host))
        hosts: list[str] = [f"{n}:*" for n in names] + names
        for host in self.allowed_hosts:
            hosts += [host] if _has_port(host) else [host, f"{host}:*"]
        origins = [f"http://{n}:*" for n in names] + list(self.allowed_origins)
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=list(dict.fromkeys(hosts)),
            allowed_origins=list(dict.fromkeys(origins)),
        )
