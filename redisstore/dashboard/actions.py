"""Who may act, and how: the operator's token, sessions, CSRF checks and the actions.

Actions are off unless the dashboard was given ``allow_actions`` and a token; then an
operator logs in with the token (``/login``), which marks their session. Every POST is
checked twice against cross-site requests: its ``Origin`` (or, without one, its
``Referer``) must be this site's, and its form must carry the session's CSRF token (a
synchronizer token: an HMAC of the session id under a secret of this process, so nothing
is stored per session). Session cookies are ``HttpOnly`` and ``SameSite=Strict``.

Each action sends what the page showed (revision, holder, grant) to one store operation
that checks it (:class:`~redisstore.dashboard.values.Source`): a stale page's action is
refused with the run as it is now.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from urllib.parse import parse_qsl, urlsplit

from starlette.requests import Request
from starlette.responses import Response

from .values import Seen

#: The actions, by the name their form posts to.
ACTIONS = ("release", "restore", "delete")

SESSION_COOKIE = "redisstore_session"
AUTH_COOKIE = "redisstore_auth"
#: The most bytes a form may send (every form of the dashboard is a few hundred).
MAX_FORM = 64 << 10


async def read_form(request: Request) -> dict[str, str]:
    """A POST's form fields (URL-encoded, as every form of the dashboard sends them; any
    other body reads as no field, so its checks refuse it). Read here rather than by
    Starlette's parser, which needs python-multipart for no form the dashboard has."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            return {}
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


class Guard:
    """The process's secret, the operator's token, and the checks every POST passes."""

    def __init__(self, *, allow_actions: bool, token: str | None) -> None:
        if allow_actions and not token:
            raise ValueError("actions need a token: give allow_actions=True a token")
        self.allow_actions = allow_actions
        self._token = (token or "").encode()
        # Per process: a restart logs every operator out and voids every page's form.
        self._secret = secrets.token_bytes(32)

    def _mac(self, purpose: str, session: str) -> str:
        return hmac.new(self._secret, f"{purpose}:{session}".encode(),
                        hashlib.sha256).hexdigest()

    def session(self, request: Request) -> tuple[str, bool]:
        """The request's session id, and whether it is new (then the response sets it)."""
        got = request.cookies.get(SESSION_COOKIE, "")
        if len(got) == 43 and got.replace("-", "").replace("_", "").isalnum():
            return got, False
        return secrets.token_urlsafe(32), True

    def csrf(self, session: str) -> str:
        """The CSRF token the session's forms carry."""
        return self._mac("csrf", session)

    def logged_in(self, request: Request) -> bool:
        session, new = self.session(request)
        if new or not self.allow_actions:
            return False
        got = request.cookies.get(AUTH_COOKIE, "")
        return hmac.compare_digest(got, self._mac("auth", session))

    def token_matches(self, given: str) -> bool:
        return bool(self._token) and hmac.compare_digest(given.encode(), self._token)

    def cross_site(self, request: Request, form: Mapping[str, object]) -> str | None:
        """Why a POST is refused as cross-site, or None: its origin, then its CSRF token."""
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        origin = request.headers.get("origin")
        if origin is None:
            referer = request.headers.get("referer")
            if referer is None:
                return "the request names no origin"
            parts = urlsplit(referer)
            origin = f"{parts.scheme}://{parts.netloc}"
        if origin != own:
            return "the request comes from another site"
        session, new = self.session(request)
        token = form.get("csrf")
        if new or not isinstance(token, str) or not hmac.compare_digest(
                token, self.csrf(session)):
            return "the form's CSRF token is missing or stale (reload the page)"
        return None

    def set_session(self, response: Response, request: Request, session: str,
                    base: str) -> None:
        response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path=base or "/")

    def log_in(self, response: Response, request: Request, base: str) -> None:
        session, _ = self.session(request)
        response.set_cookie(AUTH_COOKIE, self._mac("auth", session), httponly=True,
                            samesite="strict", secure=request.url.scheme == "https",
                            path=base or "/")

    def log_out(self, response: Response, base: str) -> None:
        response.delete_cookie(AUTH_COOKIE, path=base or "/")


def seen_from(form: Mapping[str, object]) -> Seen:
    """What the page showed, from an action's form; ValueError when it is malformed."""

    def text(name: str) -> str:
        value = form.get(name, "")
        if not isinstance(value, str):
            raise ValueError(f"{name} must be text")
        return value

    revision, owner, token = text("revision"), text("owner"), text("token")
    if not revision.isdigit() or (token and not token.isdigit()):
        raise ValueError("revision and token must be numbers")
    if bool(owner) != bool(token):
        raise ValueError("owner and token go together")
    return Seen(int(revision), owner or None, int(token) if token else None)
