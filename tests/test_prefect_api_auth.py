"""The Prefect pre-flight (``flows._prefect_api.check_api``) against a server behind basic auth.

A tiny ``http.server`` on 127.0.0.1 stands in for an authenticating proxy in front of a shared Prefect
server: ``/api/health`` answers 200 only with ``Authorization: Basic base64(user:password)``.
"""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator

import pytest

from flows import _prefect_api

USER, PASSWORD = "team", "s3cr3t-pw"
EXPECTED = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


class _BasicAuthHealth(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path == "/api/health" and self.headers.get("Authorization") == EXPECTED
        self.send_response(200 if ok else 401)
        if not ok:
            self.send_header("WWW-Authenticate", 'Basic realm="prefect"')
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"true" if ok else b"nope")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[str]:
    """``host:port`` of the basic-auth stand-in; stopped after the test."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BasicAuthHealth)
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _credentials(auth_string: str | None = None, api_key: str | None = None):
    """Prefect settings as a profile or the environment would give them (Prefect reads its environment
    once, when it is imported: a test changes the settings themselves)."""
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_KEY,
        PREFECT_API_TLS_INSECURE_SKIP_VERIFY,
        temporary_settings,
    )

    return temporary_settings(
        updates={
            PREFECT_API_AUTH_STRING: auth_string,
            PREFECT_API_KEY: api_key,
            PREFECT_API_TLS_INSECURE_SKIP_VERIFY: False,
        }
    )


def _check(url: str) -> None:
    _prefect_api.check_api(url, attempts=2, timeout_s=2.0, pause_s=0.0)


def test_the_auth_string_is_sent_as_basic_auth(proxy):
    with _credentials(auth_string=f"{USER}:{PASSWORD}"):
        _check(f"http://{proxy}/api")


def test_credentials_in_the_url_are_sent_as_basic_auth(proxy):
    with _credentials():
        _check(f"http://{USER}:{PASSWORD}@{proxy}/api")


@pytest.mark.parametrize(
    "how",
    ["none", "wrong auth string", "wrong password in the url", "api key"],
    ids=lambda s: s.replace(" ", "-"),
)
def test_refused_credentials_are_named_and_never_shown(proxy, how):
    url = f"http://{proxy}/api"
    settings: dict[str, str] = {}
    if how == "wrong auth string":
        settings["auth_string"] = f"{USER}:{PASSWORD}-old"
    elif how == "wrong password in the url":
        url = f"http://{USER}:{PASSWORD}-old@{proxy}/api"
    elif how == "api key":
        settings["api_key"] = PASSWORD
    with _credentials(**settings), pytest.raises(_prefect_api.PrefectApiUnreachable) as caught:
        _check(url)
    message = str(caught.value)
    assert (
        message.startswith("the Prefect server at http://")
        and "refused the credentials (HTTP 401)" in message
    )
    assert proxy in message and "PREFECT_API_AUTH_STRING" in message and "PREFECT_API_KEY" in message
    assert PASSWORD not in message, message
    if how == "wrong password in the url":
        assert f"http://{USER}:***@{proxy}/api" in message, message


def test_an_unreachable_url_keeps_its_message_and_masks_the_password():
    from flows._served import free_port

    port = free_port()  # nothing listens there
    with (
        _credentials(auth_string=f"{USER}:{PASSWORD}"),
        pytest.raises(_prefect_api.PrefectApiUnreachable) as caught,
    ):
        _check(f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/api")
    message = str(caught.value)
    assert message.startswith(
        f"the Prefect API at PREFECT_API_URL=http://{USER}:***@127.0.0.1:{port}/api does not answer"
    )
    assert "make serve" in message and PASSWORD not in message, message


def test_mask_url():
    assert _prefect_api.mask_url("http://u:p%40ss@h:1/api") == "http://u:***@h:1/api"
    assert _prefect_api.mask_url("http://h:1/api") == "http://h:1/api"
    assert _prefect_api.mask_url("https://u@h/api") == "https://u@h/api"
