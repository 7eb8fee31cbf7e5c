"""The chat page at ``/``: a static HTML/JS client of ``/v1/chat/completions`` (no CDN, no build).

:data:`router` serves ``chat.html`` at ``/`` and its script and style sheet under ``/ui/``; the
files ship as package data beside this module. The page needs no API key (the ``/v1`` calls it
makes send one); ``pace serve --no-ui`` leaves the router out (``ServerConfig.ui``).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

PAGE = "chat.html"
ASSETS = {"chat.js": "text/javascript", "chat.css": "text/css"}
"""The page's sibling files (served under ``/ui/``) and their media types."""

SECURITY_HEADERS = {
    # the browser itself refuses any other origin: the page loads and calls only this server
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@cache
def read_asset(name: str) -> bytes:
    """The bytes of one of the page's files (read once)."""
    return resources.files(__name__).joinpath(name).read_bytes()


def _asset_response(name: str, media_type: str) -> Response:
    return Response(read_asset(name), media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/")
async def chat_page() -> Response:
    return _asset_response(PAGE, "text/html")


def _add_asset_route(name: str, media_type: str) -> None:
    async def asset() -> Response:
        return _asset_response(name, media_type)

    router.add_api_route(f"/ui/{name}", asset, methods=["GET"], name=f"ui:{name}")


for _name, _media_type in ASSETS.items():
    _add_asset_route(_name, _media_type)
