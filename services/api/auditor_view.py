"""The auditor's view: one HTML page and its static assets (package data in
``services/api/auditor_static``), served by the API at ``/audit/``. The page holds no data of its own:
it signs in with an API key kept in the browser's session storage and calls the ``/v1`` JSON API
with it, so it sees exactly what that key's tenant may see."""

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.staticfiles import StaticFiles

STATIC = "auditor_static"
PAGE_HEADERS = {
    # everything the page loads or calls is on this server: no CDN, nothing fetched elsewhere
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def install(app: FastAPI) -> None:
    """Serve the page at ``/audit/`` and its assets at ``/audit/static/`` (kept out of the
    OpenAPI document: they are not part of the JSON contract)."""
    page = (resources.files("services.api") / STATIC / "index.html").read_text(encoding="utf-8")

    @app.get("/audit", include_in_schema=False)
    async def audit_redirect() -> RedirectResponse:
        return RedirectResponse("/audit/", status_code=308)

    @app.get("/audit/", include_in_schema=False)
    async def audit_page() -> HTMLResponse:
        return HTMLResponse(page, headers=PAGE_HEADERS)

    app.mount("/audit/static", StaticFiles(packages=[("services.api", STATIC)]), name="audit-static")
