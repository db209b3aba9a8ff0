"""Store URIs, parsed and masked in one place: ``store_kind``, ``sqlite_path``,
``check_esdb_uri``, ``mask_credentials``, ``secret_uri``. The adapters and the CLI use these
through ``uri`` (which also opens a store by its URI's scheme); the EventStoreDB adapter imports
them from here, so that no adapter depends on the module that chooses adapters.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import unquote

from terret.adapters.secret import Secret
from terret.domain.errors import InvalidStoreURI, shown

StoreKind = Literal["sqlite", "memory", "eventstoredb"]

DEFAULT_SQLITE_PATH = "terret.db"
"""The file a bare ``sqlite://`` names."""

_ESDB_PREFIXES = ("esdb://", "esdb+discover://")
_MEMORY_URIS = ("memory:", "memory://")
_SQLITE_PREFIX = "sqlite://"


# --- credentials ------------------------------------------------------------------------------

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)"
_HOSTS = re.compile(rf"{_HOST}(?::[0-9]*)?(?:,{_HOST}(?::[0-9]*)?)*")
#: The EventStoreDB options whose values (file paths, a free-form name) may hold an "@".
_AT_OPTIONS = frozenset({"tlscafile", "usercertfile", "userkeyfile", "connectionname"})


def userinfo_bounds(uri: str) -> tuple[int, int] | None:
    """Where ``user:password`` sits in a URI: from after ``://`` (or a bare ``scheme:``) to the
    ``@`` that ends it; None when the URI has no ``@``.

    A password may hold ``@``, ``/``, ``?``, ``#``, ``=`` or ``:`` although it should be
    percent-encoded, and then the URI can be read two ways. Read as RFC 3986 reads it, the
    user-info ends at the last ``@`` of the authority (which ends at the first ``/``, ``?`` or
    ``#``). That reading is taken only if it explains every ``@`` after the authority: the
    authority's hosts are ``host[:port]`` with numeric ports and each such ``@`` sits in the
    value of an option that may hold one (``TlsCaFile=/certs/a@b.pem``). Otherwise
    (``esdb://admin:hunter2?x=SECRET@host:2113``) the user-info is taken to run to the last
    ``@`` of the whole URI: a mask may hide more than it must, never less.
    """
    start = _userinfo_start(uri)
    if start is None:
        return None
    last = uri.rfind("@", start)
    if last < 0:
        return None
    end = _authority_end(uri, start)
    at = uri.rfind("@", start, end)
    if last >= end and not _ats_explained(uri, at + 1 if at >= 0 else start, end):
        return start, last
    return (start, at) if at >= 0 else None


def _userinfo_start(uri: str) -> int | None:
    """After ``scheme://``, or after a bare ``scheme:`` (``esdb:user:pass@host``, a mistyped
    URI an error message will show); None for a path."""
    scheme = _SCHEME.match(uri)
    if scheme is None:
        return None
    start = scheme.end()
    return start + 2 if uri.startswith("//", start) else start


def _authority_end(uri: str, start: int) -> int:
    ends = [i for i in (uri.find(c, start) for c in "/?#") if i >= 0]
    return min(ends, default=len(uri))


def _ats_explained(uri: str, hosts_start: int, end: int) -> bool:
    """Whether the RFC reading accounts for each ``@`` after the authority (see above)."""
    if not _HOSTS.fullmatch(uri, hosts_start, end):
        return False
    rest = uri[end:]
    rest = rest[1:] if rest.startswith("/") else rest
    if not rest.startswith("?") or "#" in rest:
        return False
    for item in rest[1:].split("&"):
        if "?" in item:
            return False
        key, sep, _ = item.partition("=")
        if "@" in item and (not sep or "@" in key or key.lower() not in _AT_OPTIONS):
            return False
    return True


def mask_credentials(uri: str) -> str:
    """The URI with its user-info replaced by ``***``, so it can be logged or shown:
    ``esdb://user:pass@host:2113?Tls=true`` → ``esdb://***@host:2113?Tls=true``.

    No part of the user-info is shown, whether the URI parses or not (see
    :func:`userinfo_bounds`). A URI without user-info but with a port that is not a number
    (``esdb://admin:hunter2``, its ``@host`` forgotten) has the port masked too."""
    bounds = userinfo_bounds(uri)
    if bounds is None:
        return _mask_bad_ports(uri)
    start, at = bounds
    return uri[:start] + "***" + uri[at:]


def _mask_bad_ports(uri: str) -> str:
    start = _userinfo_start(uri)
    if start is None:
        return uri
    end = _authority_end(uri, start)
    targets = [_mask_port(target) for target in uri[start:end].split(",")]
    return uri[:start] + ",".join(targets) + uri[end:]


def _mask_port(target: str) -> str:
    host, port = _split_target(target)
    return target if port is None or _digits(port) else f"{host}:***"


def _digits(port: str) -> bool:
    """A port written as a number (in range or not: ``70000`` is no password to hide)."""
    return port.isascii() and port.isdigit()


def _split_target(target: str) -> tuple[str, str | None]:
    """``host[:port]`` → ``(host, port)`` (``port`` None when there is no colon); a bracketed
    IPv6 host keeps its colons."""
    if target.startswith("["):
        close = target.find("]")
        if close >= 0:
            tail = target[close + 1 :]
            return target[: close + 1], tail[1:] if tail.startswith(":") else (tail or None)
    host, sep, port = target.partition(":")
    return host, port if sep else None


def _valid_port(port: str) -> bool:
    # Empty means the default (esdbclient reads "host:" as host:2113).
    return port == "" or (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)


def credentials(uri: str) -> list[str]:
    """The pieces of a URI's user-info an error text may quote (the whole of it, the user, the
    password, what lies between "@"s, each percent-decoded too), longest first."""
    bounds = userinfo_bounds(uri)
    if bounds is None:
        return []
    userinfo = uri[bounds[0] : bounds[1]]
    user, _, password = userinfo.partition(":")
    # A client that splits the user-info differently may quote a piece of it (esdbclient
    # takes the host list from after the *first* "@"): mask the pieces as well. Short pieces
    # are left to the secret's minimum length.
    pieces = [userinfo, password, user, *userinfo.split("@")]
    found = set(pieces) | {unquote(piece) for piece in pieces}
    return sorted((piece for piece in found if piece), key=len, reverse=True)


def secret_uri(uri: str, display: str | None = None) -> Secret:
    """``uri`` as a :class:`~terret.adapters.secret.Secret`: it prints as ``display`` (default:
    the masked URI) and scrubs the URI and its credentials from texts (an esdbclient message
    that quotes either)."""
    return Secret(
        uri,
        masked=mask_credentials(uri) if display is None else display,
        hide=credentials(uri),
    )


def check_esdb_uri(uri: str) -> None:
    """Refuse, with ``InvalidStoreURI`` (credentials masked), an EventStoreDB URI that cannot
    work whatever the server says: credentials holding ``@``, ``/``, ``?`` or ``#`` (esdbclient
    cannot parse them in any spelling), a host left empty, or a host whose port is not a number
    from 1 to 65535 (either would otherwise be retried as an unreachable server)."""
    masked = mask_credentials(uri)
    bounds = userinfo_bounds(uri)
    bad = sorted(set("@/?#") & set(uri[bounds[0] : bounds[1]])) if bounds else []
    if bad:
        # esdbclient splits the URI with urlparse (which ends the host part at "/", "?" or
        # "#") and takes the hosts from after the *first* "@"; it passes the password on
        # without percent-decoding, so such credentials cannot work in any spelling.
        raise InvalidStoreURI(
            f"invalid EventStoreDB URI {shown(masked)}: the user name or password contains "
            f"{' '.join(repr(c) for c in bad)}, which esdbclient cannot parse; "
            "choose credentials without '@', '/', '?' or '#'"
        )
    start = _userinfo_start(uri)
    if start is None:
        return
    end = _authority_end(uri, start)
    hosts = uri[bounds[1] + 1 if bounds else start : end]
    for target in hosts.split(","):
        host, port = _split_target(target.strip())
        if not host.strip():
            raise InvalidStoreURI(
                f"invalid EventStoreDB URI {shown(masked)}: a host name is missing (write "
                "host:port, e.g. localhost:2113)")
        if port is not None and not _valid_port(port):
            hidden = "" if bounds or _digits(port) else \
                " (not shown: it may be a password, '@host' forgotten)"
            raise InvalidStoreURI(
                f"invalid EventStoreDB URI {shown(masked)}: the port of host {host!r} is not a "
                f"number from 1 to 65535{hidden}; write host:port, e.g. localhost:2113"
            )


# --- parsing ----------------------------------------------------------------------------------


def store_kind(uri: str) -> StoreKind:
    """Which adapter a store URI names; ``InvalidStoreURI`` (credentials masked) if none."""
    if uri.startswith(_ESDB_PREFIXES):
        return "eventstoredb"
    if uri in _MEMORY_URIS:
        return "memory"
    if uri.startswith(_SQLITE_PREFIX):
        return "sqlite"
    if "://" in uri or uri.startswith(("esdb:", "esdb+discover:")):
        raise InvalidStoreURI(
            f"unsupported store URI {mask_credentials(uri)!r}: "
            "use a SQLite path, sqlite:///path, memory:, esdb:// or esdb+discover://"
        )
    return "sqlite"  # a bare path


def sqlite_path(uri: str) -> str | None:
    """The SQLite file a store URI names (a bare path, ``sqlite://path``, or
    ``DEFAULT_SQLITE_PATH`` for a bare ``sqlite://``); None for the other stores.
    Raises ``InvalidStoreURI`` as ``store_kind`` does."""
    if store_kind(uri) != "sqlite":
        return None
    return uri.removeprefix(_SQLITE_PREFIX) or DEFAULT_SQLITE_PATH
