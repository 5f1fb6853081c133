"""A moto S3 server on 127.0.0.1 for tests and ``kvfs bench s3``: a real HTTP endpoint.

``MotoS3`` starts moto's threaded server on a free port; :meth:`MotoS3.stop` takes it
down (connections are refused), :meth:`MotoS3.stall` stops serving but keeps the port
listening (connections hang, as with a wedged endpoint), :meth:`MotoS3.start` brings it
back on the same port. Moto keeps its buckets in process memory, so they survive a
restart, like a real endpoint's.
"""

from __future__ import annotations

import os
import socket

import pytest
from moto.server import ThreadedMotoServer

__all__ = ["MotoS3", "fake_credentials", "moto"]

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def fake_credentials() -> dict[str, str | None]:
    """Put moto's fake credentials in the environment; returns the old values."""
    old = {k: os.environ.get(k) for k in FAKE_ENV}
    os.environ.update(FAKE_ENV)
    return old


def restore_env(old: dict[str, str | None]) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._server: ThreadedMotoServer | None = None
        self._stalled = False

    def start(self) -> MotoS3:
        self._release()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port: new connections are refused."""
        if self._server is not None:
            self._server.stop()
        self._release()

    def stall(self) -> None:
        """Stop serving but keep the port open: requests connect and never get an answer."""
        if self._server is not None:
            self._server.stop()
            self._stalled = True

    def _release(self) -> None:
        if self._server is not None and self._server._server is not None:
            self._server._server.server_close()
        self._server = None
        self._stalled = False

    def client(self):
        import boto3

        return boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1")


@pytest.fixture(scope="session")
def moto():
    """A moto S3 server for the session, with fake credentials in the environment.
    Import it into a test module to use it (``from s3server import moto``)."""
    old = fake_credentials()
    server = MotoS3().start()
    yield server
    server.stop()
    restore_env(old)
