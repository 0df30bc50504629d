"""Mounting the dashboard: `mount(app, config)` adds its pages, login, static assets and the offline API docs
to a FastAPI app whose store is `app.state.store` and whose tokens are `app.state.tokens`;
`create_ui_app(db_url, config, tokens)` is a read-only app with the dashboard alone (`sessionrl ui`).

Every asset is served from the package (`static/`), so the pages and `/docs` work without internet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, FastAPI, Form, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from sessionrl import __version__
from sessionrl.access import Scope, TokenTable
from sessionrl.skills import load_contracts
from sessionrl.skills.contract import Sla
from sessionrl.store import SessionStore
from sessionrl.ui import policies, sessions, training
from sessionrl.ui.auth import COOKIE, LOGIN_PATH, LoginRequired, login_url, principal_of, safe_next
from sessionrl.ui.config import UIConfig

_log = logging.getLogger(__name__)
HERE = Path(__file__).parent
STATIC = "/ui/static"


@dataclass(frozen=True, slots=True)
class Dashboard:
    """What the pages share, kept on `app.state.ui`: settings, templates and the contracts' SLAs."""

    config: UIConfig
    templates: Jinja2Templates
    slas: Mapping[str, Sla]


def mount(app: FastAPI, config: UIConfig | None = None) -> None:
    """Add the dashboard (under `/ui`), its assets and the offline `/docs` to `app`."""
    config = config or UIConfig()
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.globals["static"] = STATIC
    for name in templates.env.list_templates():  # compiled now, not by the first request of each page
        templates.env.get_template(name)
    contracts = load_contracts(config.skills_dir) if config.skills_dir is not None else {}
    app.state.ui = Dashboard(config, templates, {name: c.sla for name, c in contracts.items()})
    app.mount(STATIC, StaticFiles(directory=HERE / "static"), name="ui-static")
    app.include_router(login_router())
    app.include_router(sessions.router)
    app.include_router(training.router)
    app.include_router(policies.router)
    app.add_exception_handler(LoginRequired, _to_login)  # type: ignore[arg-type]
    mount_docs(app)


def mount_docs(app: FastAPI) -> None:
    """Serve Swagger UI for `/docs` from the package's copy (the app is built with `docs_url=None`)."""

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{STATIC}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{STATIC}/favicon.svg",
            swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from the validator site
        )


async def _to_login(request: Request, exc: LoginRequired) -> Response:
    return RedirectResponse(login_url(exc.next_url), status_code=303)


def login_router() -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui", include_in_schema=False)
    async def home() -> Response:
        return RedirectResponse("/ui/sessions", status_code=303)

    @router.get(LOGIN_PATH)
    async def login_page(request: Request, next: str | None = None) -> Response:
        page = {"next": safe_next(next), "error": None}
        return request.app.state.ui.templates.TemplateResponse(request, "login.html", page)  # type: ignore[no-any-return]

    @router.post(LOGIN_PATH)
    async def login(
        request: Request, token: Annotated[str, Form()], next: Annotated[str, Form()] = "/ui/sessions"
    ) -> Response:
        if principal_of(request.app.state.tokens, token.strip()) is None:
            page = {"next": safe_next(next), "error": "unknown token, or one without the read scope"}
            ui: Dashboard = request.app.state.ui
            return ui.templates.TemplateResponse(request, "login.html", page, status_code=401)
        answer = RedirectResponse(safe_next(next), status_code=303)
        secure = request.url.scheme == "https"
        answer.set_cookie(COOKIE, token.strip(), httponly=True, samesite="strict", secure=secure, path="/")
        return answer

    @router.post("/ui/logout")
    async def logout() -> Response:
        answer = RedirectResponse(LOGIN_PATH, status_code=303)
        answer.delete_cookie(COOKIE, path="/")
        return answer

    return router


def create_ui_app(db_url: str, config: UIConfig, tokens: Mapping[str, frozenset[Scope]]) -> FastAPI:
    """The dashboard alone over the store at `db_url`: pages, the list's read API and its docs, no step
    API, nothing that writes. Changes not yet projected are projected before it serves."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with SessionStore.open(db_url) as store:
            # warm at start: what was appended but not yet projected is projected before the first page
            # asks (a query drains the outbox first, so a store filled in bulk made its first page wait)
            started = time.perf_counter()
            projected = await asyncio.to_thread(store.project)
            if projected:
                _log.info("projected %d pending changes in %.1f s", projected, time.perf_counter() - started)
            app.state.store = store
            yield

    app = FastAPI(
        title="sessionrl dashboard", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.tokens = TokenTable(tokens)
    mount(app, config)
    app.include_router(sessions.api)  # what /docs documents here (`serve` documents its step API)
    return app
