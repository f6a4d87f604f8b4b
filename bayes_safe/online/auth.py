"""Bearer tokens and their roles for ``bayes-safe serve`` (and the token its clients send).

**The token file** (``bayes-safe serve --token-file PATH``, or the environment variable
``BAYES_SAFE_TOKEN_FILE`` naming it; never a token on the command line, where ``ps`` shows it):
one token per line, then its roles, comma-separated; ``#`` starts a comment::

    # bayes-safe serve tokens: TOKEN ROLE[,ROLE...]
    9oD0y3b6R4yq0u3cQy3n8v0kZs1hUo2Fh3dQw2Wc2xM  decide,feedback
    q0bq5cYV1sJc8g7V0lF9oQ2nWm6pK8tR3eXz4aLd1uE  read

Roles: ``decide`` (``POST /decide``), ``feedback`` (``POST /feedback``), ``read`` (``GET
/posterior`` and ``/metrics``), or ``all`` (the three). A token is at least 16 characters of
``A-Z a-z 0-9 - . _ ~ + /`` (optionally ending in ``=``: RFC 6750's ``token68``); ``python -c
"import secrets; print(secrets.token_urlsafe(32))"`` makes one. A malformed file (a bad line, an
unknown role, a short or repeated token, no token at all) is a ``TokenFileError`` naming the file
and the line, raised before the service starts; error messages never show a token. A file that
its group or other users can read gets a warning (``permission_warning``), not a refusal (secrets
mounted by a container runtime are often 0644).

**Checking.** Only the SHA-256 digests of the tokens are kept. A request's token is hashed once
and compared with every configured digest by ``hmac.compare_digest`` (equal lengths, so the
comparison time does not depend on where they differ), all of them, with no early exit.

**Clients** (``bayes-safe feedback --url``): ``client_token`` takes the token from ``--token-file``
(a file holding the token alone, or a server token file: its first token with the role needed),
else from the environment variable ``BAYES_SAFE_TOKEN`` (the token itself), else from the file
``BAYES_SAFE_TOKEN_FILE`` names.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENV_TOKEN", "ENV_TOKEN_FILE", "ROLES", "TokenFileError", "Tokens", "client_token", "load_tokens",
           "permission_warning"]

ROLES = ("decide", "feedback", "read")
ENV_TOKEN_FILE = "BAYES_SAFE_TOKEN_FILE"
ENV_TOKEN = "BAYES_SAFE_TOKEN"
MIN_TOKEN_LENGTH = 16
_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")


class TokenFileError(ValueError):
    """A token file that cannot be used: the message names the file and the line (never the token)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("latin-1")).digest()


@dataclass(frozen=True)
class Tokens:
    """The configured tokens (their digests) and roles. ``source``: where they came from (for messages)."""

    entries: tuple[tuple[bytes, frozenset], ...]
    source: str = "tokens"

    def __len__(self) -> int:
        return len(self.entries)

    def roles_of(self, authorization: str | bytes | None) -> frozenset | None:
        """The roles of the token in an ``Authorization: Bearer <token>`` value; None when there is no
        such header, it is not a bearer token, or the token is not one of these (constant time over
        every configured token)."""
        if authorization is None:
            return None
        if isinstance(authorization, bytes):
            authorization = authorization.decode("latin-1")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = _digest(token.strip())
        found = None
        for known, roles in self.entries:  # every entry, no early exit (tokens are distinct: one matches at most)
            hit = hmac.compare_digest(known, digest)
            found = roles if hit else found
        return found

    def check(self, authorization, role: str, what: str) -> tuple[int, str] | None:
        """None when the token holds ``role``; else ``(401, message)`` (no token, or not a known one)
        or ``(403, message)`` (a known token without the role). ``what``: the endpoint, for messages."""
        roles = self.roles_of(authorization)
        if roles is None:
            if authorization is None:
                return 401, (f"{what} needs a token with the {role!r} role: send the header "
                             "'Authorization: Bearer <token>'")
            return 401, f"{what} needs a token with the {role!r} role: the token sent is not one of this service's"
        if role not in roles:
            return 403, (f"{what} needs a token with the {role!r} role; the token sent has "
                         f"{', '.join(sorted(roles))}")
        return None


def _parse(text: str, where: str) -> Tokens:
    entries, seen = [], {}
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenFileError(f"{where}:{n}: expected 'TOKEN ROLE[,ROLE...]' (roles: {', '.join(ROLES)} or all), "
                                 f"got {len(parts)} field(s)")
        token, role_text = parts
        if not _TOKEN.fullmatch(token):
            raise TokenFileError(f"{where}:{n}: the token has characters outside A-Z a-z 0-9 - . _ ~ + / (and a "
                                 "trailing =)")
        if len(token) < MIN_TOKEN_LENGTH:
            raise TokenFileError(f"{where}:{n}: the token is {len(token)} characters long; expected at least "
                                 f"{MIN_TOKEN_LENGTH} (python -c \"import secrets; print(secrets.token_urlsafe(32))\")")
        roles = set()
        for role in role_text.split(","):
            role = role.strip().lower()
            if role == "all":
                roles.update(ROLES)
            elif role in ROLES:
                roles.add(role)
            else:
                raise TokenFileError(f"{where}:{n}: unknown role {role!r} (expected {', '.join(ROLES)} or all, "
                                     "comma-separated)")
        digest = _digest(token)
        if digest in seen:
            raise TokenFileError(f"{where}:{n}: the same token as line {seen[digest]} (give each token one line "
                                 "with all its roles)")
        seen[digest] = n
        entries.append((digest, frozenset(roles)))
    if not entries:
        raise TokenFileError(f"{where}: no tokens (expected lines 'TOKEN ROLE[,ROLE...]')")
    return Tokens(tuple(entries), where)


def _read(path: Path, option: str) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TokenFileError(f"{option}: no such file {str(path)!r}") from None
    except IsADirectoryError:
        raise TokenFileError(f"{option}: {path} is a directory, not a token file") from None
    except OSError as exc:
        raise TokenFileError(f"{option}: cannot read {path} ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenFileError(f"{option}: {path} is not a text file (not UTF-8)") from None


def load_tokens(path=None, environ=None) -> Tokens | None:
    """The tokens of the file ``path`` (``--token-file``), else of the file the environment variable
    ``BAYES_SAFE_TOKEN_FILE`` names; None when neither is given (no tokens: every endpoint open).
    A malformed file is a ``TokenFileError`` naming the option, the file and the line."""
    environ = os.environ if environ is None else environ
    option = "--token-file"
    if path is None:
        path = environ.get(ENV_TOKEN_FILE) or None
        option = ENV_TOKEN_FILE
    if path is None:
        return None
    path = Path(path)
    return _parse(_read(path, option), f"{option}: {path}")


def permission_warning(path) -> str | None:
    """A warning when the token file ``path`` can be read by its group or other users, else None."""
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return (f"the token file {path} can be read by other users (mode {stat.S_IMODE(mode):04o}): "
                f"chmod 600 {path}")
    return None


def client_token(path=None, role: str = "feedback", environ=None) -> str | None:
    """The token a client sends for ``role``: from the file ``path`` (``--token-file``: the token
    alone on a line, or a server token file, whose first token with ``role`` is taken), else the
    environment variable ``BAYES_SAFE_TOKEN``, else the file ``BAYES_SAFE_TOKEN_FILE`` names; None
    when there is none (a service without tokens)."""
    environ = os.environ if environ is None else environ
    option = "--token-file"
    if path is None:
        token = (environ.get(ENV_TOKEN) or "").strip()
        if token:
            if not _TOKEN.fullmatch(token):
                raise TokenFileError(f"{ENV_TOKEN}: the token has characters outside A-Z a-z 0-9 - . _ ~ + / (and a "
                                     "trailing =)")
            return token
        path = environ.get(ENV_TOKEN_FILE) or None
        option = ENV_TOKEN_FILE
    if path is None:
        return None
    path = Path(path)
    where = f"{option}: {path}"
    text = _read(path, option)
    lines = [(n, line.split("#", 1)[0].split()) for n, line in enumerate(text.splitlines(), start=1)]
    lines = [(n, parts) for n, parts in lines if parts]
    if len(lines) == 1 and len(lines[0][1]) == 1:  # the token alone
        n, (token,) = lines[0]
        if not _TOKEN.fullmatch(token):
            raise TokenFileError(f"{where}:{n}: the token has characters outside A-Z a-z 0-9 - . _ ~ + / (and a "
                                 "trailing =)")
        return token
    _parse(text, where)  # the server's format, checked (messages name the line)
    for _, (token, role_text) in lines:
        roles = {r.strip().lower() for r in role_text.split(",")}
        if role in roles or "all" in roles:
            return token
    raise TokenFileError(f"{where}: no token with the {role!r} role")
