"""The chat page at ``/`` (pace_core.server.ui): served self-contained, off with ``--no-ui``,
open without the API key that its ``/v1`` calls need. The browser run is in
test_chat_page_browser.py (slow)."""

from __future__ import annotations

import argparse
import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import httpx
import pytest

from pace_core.server.launch.cli import add_serve_parser, serve_configs
from pace_core.server.ui import ASSETS

from .conftest import serve

URL_ATTRIBUTES = {"src", "href", "action", "formaction", "srcset", "poster", "data", "manifest"}
EXTERNAL_IN_TEXT = re.compile(r"""(?:https?:)?//[\w.-]+\.\w|@import|url\(\s*['"]?(?!data:)""")


class _References(HTMLParser):
    """Every URL-valued attribute of a page, as (tag, attribute, value)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in URL_ATTRIBUTES and value is not None:
                self.found.append((tag, name, value))


def page_references(html: str) -> list[tuple[str, str, str]]:
    parser = _References()
    parser.feed(html)
    parser.close()
    return parser.found


def is_same_origin(url: str) -> bool:
    """A path on this server or inline data: no scheme other than data:, no host."""
    parts = urlsplit(url)
    return not parts.netloc and parts.scheme in ("", "data")


@pytest.fixture(scope="module")
def keyed_server(llm):
    with serve(llm, api_key="sekrit") as http:
        yield http


def test_page_is_html_and_self_contained(keyed_server):
    page = httpx.get(keyed_server.url + "/", timeout=30)
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in page.headers["content-security-policy"]
    refs = page_references(page.text)
    assert {value for _, _, value in refs} >= {f"/ui/{name}" for name in ASSETS}
    outside = [ref for ref in refs if not is_same_origin(ref[2])]
    assert not outside, f"the page refers to other hosts: {outside}"
    for _, _, value in refs:
        if not value.startswith("data:"):
            assert httpx.get(keyed_server.url + value, timeout=30).status_code == 200, value


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_assets_have_their_type_and_no_external_urls(keyed_server, name):
    asset = httpx.get(f"{keyed_server.url}/ui/{name}", timeout=30)
    assert asset.status_code == 200
    assert asset.headers["content-type"].startswith(ASSETS[name])
    assert not EXTERNAL_IN_TEXT.search(asset.text), EXTERNAL_IN_TEXT.search(asset.text)


def test_the_external_url_checks_catch_what_they_should():
    html = '<script src="https://cdn.example.com/x.js"></script><a href="//evil.test/">x</a>'
    assert [is_same_origin(v) for _, _, v in page_references(html)] == [False, False]
    assert is_same_origin("/ui/chat.js") and is_same_origin("data:,")
    for text in ('fetch("https://api.example.com/v1")', '@import "x.css";', "url(/a.png)"):
        assert EXTERNAL_IN_TEXT.search(text), text
    assert not EXTERNAL_IN_TEXT.search('fetch("/v1/chat/completions"); a // comment')


def test_page_needs_no_key_but_v1_does(keyed_server):
    assert httpx.get(keyed_server.url + "/", timeout=30).status_code == 200
    assert httpx.get(keyed_server.url + "/ui/chat.js", timeout=30).status_code == 200
    denied = httpx.get(keyed_server.url + "/v1/models", timeout=30)
    assert denied.status_code == 401
    assert denied.json()["error"]["code"] == "invalid_api_key"
    auth = {"Authorization": "Bearer sekrit"}
    assert httpx.get(keyed_server.url + "/v1/models", headers=auth, timeout=30).status_code == 200


def test_no_ui_is_a_404_in_the_openai_error_shape(llm):
    with serve(llm, ui=False) as http:
        for path in ("/", "/ui/chat.js"):
            response = httpx.get(http.url + path, timeout=30)
            assert response.status_code == 404, path
            error = response.json()["error"]
            assert error["type"] == "not_found_error" and error["message"]
        assert httpx.get(http.url + "/health", timeout=30).status_code == 200


def test_no_ui_flag_reaches_the_server_config():
    parser = argparse.ArgumentParser(prog="pace")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    assert serve_configs(parser.parse_args(["serve"]))[2].ui is True
    assert serve_configs(parser.parse_args(["serve", "--no-ui"]))[2].ui is False
