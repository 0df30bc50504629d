"""Who may see the dashboard: the service's bearer tokens, carried by an HttpOnly cookie for the browser.

The login form takes a token with the read scope and sets it as a cookie (HttpOnly, SameSite=Strict, so
page scripts cannot read it and other sites cannot send it). The cookie is honoured by the dashboard's
pages only: the API keeps asking for an `Authorization` header, so a browser session can read but never
write through the API.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Request

from sessionrl.access import Principal, Scope, TokenTable

COOKIE = "sessionrl_token"
LOGIN_PATH = "/ui/login"


class LoginRequired(Exception):
    """Raised by `viewer` when a page is asked for without a read token; the handler sends the browser
    to the login page, then back."""

    def __init__(self, next_url: str) -> None:
        super().__init__(next_url)
        self.next_url = next_url


def principal_of(tokens: TokenTable, token: str | None) -> Principal | None:
    """The principal of a token that may read, or None."""
    if not token:
        return None
    principal = tokens.lookup(token)
    return principal if principal is not None and Scope.READ in principal.scopes else None


def viewer(request: Request) -> Principal:
    """A dependency admitting a read token from the cookie or the `Authorization` header."""
    scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
    token = bearer.strip() if scheme.lower() == "bearer" else request.cookies.get(COOKIE)
    principal = principal_of(request.app.state.tokens, token)
    if principal is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target)
    return principal


def login_url(next_url: str) -> str:
    """The login page, returning to `next_url` afterwards."""
    return f"{LOGIN_PATH}?next={quote(next_url, safe='')}"


def safe_next(next_url: str | None) -> str:
    """Where to go after logging in: a path of this site only (never another host)."""
    if not next_url or not next_url.startswith("/") or next_url.startswith("//"):
        return "/ui/sessions"
    return next_url
