"""The client's promise of issue 38: one hierarchy of errors and one connection for both
sides. A refusal is the same class whether an artifacts call or a collection operation
met it (one map from the HTTP status), under every name the faces have always exported;
one client's settings (endpoint, token, CA file) reach the artifacts and the collections
alike. In-process: the real service app (it serves both) on the embedded store, a
stand-in bucket over HTTP (``test_writes.serve``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from o41 import artifacts, sky
from o41.client import collections as client_collections
from o41.client import errors, place, tls, transport
from o41.client.connection import Connection
from o41.client.errors import ConnectError
from o41.core.places import Place
from test_writes import Service, serve
from testbed.locations import ORG
from testbed.process import LOOPBACK, free_port

PLACE = Place("aws", "us-east-1", "env")


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


@pytest.fixture(autouse=True)
def compute(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("O41_COMPUTE", "job-1")
    return "job-1"


def raised(call: Callable[[], Any]) -> BaseException:
    """What ``call`` raised (it must raise)."""
    try:
        call()
    except BaseException as e:
        return e
    raise AssertionError(f"{call} raised nothing")


def test_every_name_users_catch_is_a_class_of_the_one_hierarchy() -> None:
    root = errors.O41Error
    # the roots each face has always documented are one class
    assert artifacts.Error is errors.ArtifactError is sky.CollectionError is root
    assert transport.CollectionError is client_collections.CollectionError is root
    # each refusal is defined once, under both faces' names
    assert artifacts.Conflict is sky.Conflict is transport.Conflict is errors.Conflict
    assert artifacts.Unavailable is sky.Unavailable is transport.Unavailable
    assert artifacts.TransportError is sky.TransportError
    assert artifacts.BadRequest is sky.InvalidRequest is transport.InvalidRequest
    assert artifacts.NotAllowed is sky.NotAllowed
    assert artifacts.NotFound is sky.NotFound
    assert artifacts.LimitReached is sky.LimitReached is transport.LimitReached
    assert sky.ValueTooLarge is transport.ValueTooLarge is errors.TooLarge
    assert place.PlaceConfigError is errors.PlaceConfigError
    assert tls.CaFileError is errors.CaFileError
    # the Python exceptions callers catch them as
    assert issubclass(sky.Conflict, ValueError)
    assert issubclass(sky.InvalidRequest, ValueError)
    assert issubclass(sky.ValueTooLarge, ValueError)
    assert issubclass(sky.NotAllowed, PermissionError)
    assert issubclass(artifacts.Forbidden, sky.NotAllowed)
    assert issubclass(artifacts.Unauthorized, sky.NotAllowed)
    assert issubclass(sky.Unavailable, ConnectionError)
    assert issubclass(artifacts.TransportError, sky.Unavailable)  # no answer: retry too
    assert issubclass(place.PlaceConfigError, ValueError)
    assert issubclass(tls.CaFileError, ValueError)
    for name in (*errors.__all__, "Error"):
        found = getattr(errors, name, None) or getattr(artifacts, name)
        if isinstance(found, type):
            assert issubclass(found, root), name


def test_one_map_from_a_status_for_both_sides() -> None:
    expected = {
        400: artifacts.BadRequest,
        401: artifacts.Unauthorized,
        403: artifacts.Forbidden,
        404: artifacts.NotFound,
        409: artifacts.Conflict,
        413: sky.ValueTooLarge,
        415: artifacts.BadRequest,
        422: artifacts.BadRequest,
        429: sky.LimitReached,
        500: artifacts.Unavailable,
        503: artifacts.Unavailable,
        504: artifacts.Unavailable,
        507: sky.LimitReached,
        418: artifacts.ServiceError,
    }
    for status, cls in expected.items():
        error = errors.service_error(status, "why", {"error": "why", "current": "v1"})
        assert isinstance(error, cls) and isinstance(error, artifacts.ServiceError), status
        assert (error.status, str(error)) == (status, "why")
    assert errors.service_error(409, "moved", {"current": "v1"}).current == "v1"  # type: ignore[attr-defined]


def test_an_error_crosses_a_process_boundary_as_it_was() -> None:
    """A DataLoader worker's error reaches its parent pickled: the class, the message and
    what it carries come through (sky's errors did before issue 38; now every one)."""
    import pickle

    conflict = errors.service_error(409, "tag moved", {"error": "tag moved", "current": "v1"})
    conflict.resume = "v0"
    for error in (
        conflict,
        errors.service_error(503, "etcd has no majority"),
        errors.service_error(403, "not this namespace"),
        artifacts.TransportError("did not answer"),
        place.PlaceConfigError("O41_ARTIFACTS_CLOUD", "O41_ARTIFACTS_REGION"),
        artifacts.Damaged("part 2 differs", part=2),
    ):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert (back.status, dict(back.body), back.resume) == (
            error.status,
            dict(error.body),
            error.resume,
        )
    assert pickle.loads(pickle.dumps(conflict)).current == "v1"


async def test_a_409_is_one_class_whichever_side_answered_it(service: Service) -> None:
    client = artifacts.Client(service.url, str(service.token), place=PLACE, timeout=30)

    def tag_twice() -> tuple[str, BaseException]:
        written = client.write(ORG, "m", b"weights")
        other = client.write(ORG, "m", b"other weights")
        client.tag(ORG, "m", "first", written.version, expected=None)
        # (the same move again would answer success: a repeat of one that landed)
        again = raised(lambda: client.tag(ORG, "m", "first", other.version, expected=None))
        return written.version, again

    def barrier_of_other_parties() -> BaseException:
        with pytest.raises(TimeoutError):
            client.collections.barrier("start", 2).wait(timeout=0.2)
        return raised(lambda: client.collections.barrier("start", 3).wait(timeout=1))

    version, from_artifacts = await asyncio.to_thread(tag_twice)
    from_collections = await asyncio.to_thread(barrier_of_other_parties)
    assert type(from_artifacts) is type(from_collections)
    for error in (from_artifacts, from_collections):
        assert isinstance(error, artifacts.Conflict) and isinstance(error, sky.Conflict)
        assert isinstance(error, ValueError) and isinstance(error, sky.CollectionError)
        assert isinstance(error, artifacts.Error)
        assert error.status == 409
    assert isinstance(from_artifacts, artifacts.Conflict)
    assert from_artifacts.current == version  # where the tag points now
    assert "created for 2 parties, not 3" in str(from_collections)


async def test_a_token_the_service_refuses_is_one_class_whichever_side(
    service: Service, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger"
    stranger.write_text("a token nobody issued")
    client = artifacts.Client(service.url, str(stranger), place=PLACE, timeout=30)
    from_artifacts = await asyncio.to_thread(raised, lambda: client.latest(ORG, "m"))
    from_collections = await asyncio.to_thread(
        raised, lambda: client.collections.counter("c").add(1)
    )
    assert type(from_artifacts) is type(from_collections) is artifacts.Unauthorized
    for error in (from_artifacts, from_collections):
        assert isinstance(error, sky.NotAllowed) and isinstance(error, PermissionError)
        assert error.status == 401


def test_a_service_that_does_not_answer_is_one_class_whichever_side() -> None:
    nobody = f"http://{LOOPBACK}:{free_port()}"  # nothing listens there
    # no retries: what the retries end with is tests/client/test_hub_blink.py's
    client = artifacts.Client(nobody, place=PLACE, timeout=5, retry_deadline=0)
    from_artifacts = raised(lambda: client.latest(ORG, "m"))
    from_collections = raised(lambda: client.collections.dict("d").get("k"))
    assert type(from_artifacts) is type(from_collections) is ConnectError
    for error in (from_artifacts, from_collections):
        assert isinstance(error, artifacts.TransportError) and not error.sent
        assert isinstance(error, sky.Unavailable) and isinstance(error, ConnectionError)
        assert error.status is None  # no answer, no status
        # one message for both sides: what was not reached, and what to check
        assert f"cannot reach the placement service at {nobody}" in str(error)
        assert "check O41_ARTIFACTS_ENDPOINT" in str(error)


async def test_one_clients_token_and_endpoint_reach_both_sides(service: Service) -> None:
    client = artifacts.Client(service.url, str(service.token), place=PLACE, timeout=30)

    def both() -> tuple[str, int]:
        written = client.write(ORG, "m", b"weights")
        client.collections.dict("runs")["last"] = written.version
        return client.collections.dict("runs")["last"], client.collections.counter("c").add(2)

    version, count = await asyncio.to_thread(both)
    assert await asyncio.to_thread(client.read_bytes, ORG, "m", version) == b"weights"
    assert count == 2
    assert client.collections.transport.connection is client.connection  # type: ignore[attr-defined]
    # the collections of the service, not embedded ones: another client of it sees them
    other = sky.Client.over(Connection(service.url, token_file=str(service.token)))
    assert await asyncio.to_thread(other.counter("c").get) == 2


async def test_the_environment_is_read_once_and_alike_for_both_faces(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("O41_ARTIFACTS_ENDPOINT", service.url)
    monkeypatch.setenv("O41_ARTIFACTS_TOKEN_FILE", str(service.token))
    monkeypatch.setenv("O41_ARTIFACTS_CLOUD", "aws")
    monkeypatch.setenv("O41_ARTIFACTS_REGION", "us-west-2")
    place.reset()
    sky.configure(None)
    try:

        def both() -> tuple[str, int]:
            written = artifacts.Client().write(ORG, "m", b"from the environment")
            return written.location, sky.counter("steps").add(1)

        assert await asyncio.to_thread(both) == ("west", 1)
        # the default sky client is the service's, as the artifacts client is
        by_artifacts = artifacts.Client().collections
        assert await asyncio.to_thread(by_artifacts.counter("steps").get) == 1
    finally:
        sky.configure(None)
        place.reset()


async def test_sky_and_artifacts_configured_with_one_client(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "_default", None)  # the module's default, as it was after
    client = artifacts.configure(service.url, str(service.token), PLACE, 30)
    sky.configure(client.collections)
    try:

        def both() -> tuple[int, str | None]:
            sky.counter("c").add(5)
            written = artifacts.write(ORG, "m", b"weights", tag="best")
            return client.collections.counter("c").get(), written.tag

        assert await asyncio.to_thread(both) == (5, "best")
    finally:
        sky.configure(None)


def test_a_ca_file_given_once_is_used_by_both_sides(tmp_path: Path) -> None:
    missing = tmp_path / "missing-ca.crt"
    client = artifacts.Client(
        f"https://{LOOPBACK}:{free_port()}", place=PLACE, ca_file=str(missing), timeout=5
    )
    from_artifacts = raised(lambda: client.latest(ORG, "m"))
    from_collections = raised(lambda: client.collections.counter("c").add(1))
    assert type(from_artifacts) is type(from_collections) is tls.CaFileError
    for error in (from_artifacts, from_collections):
        assert f"O41_ARTIFACTS_CA_FILE={missing} cannot be read" in str(error)
        assert isinstance(error, artifacts.Error) and isinstance(error, ValueError)


def test_a_connection_or_its_settings_not_both() -> None:
    connection = Connection("http://127.0.0.1:1")
    with pytest.raises(TypeError, match=r"give a connection or its settings \(ca_file"):
        artifacts.Client(connection=connection, ca_file="/ca.crt")
    with pytest.raises(TypeError, match=r"not both"):
        sky.HttpTransport("http://127.0.0.1:2", connection=connection)
    assert artifacts.Client(connection=connection).connection is connection


def test_no_endpoint_is_a_configuration_error_saying_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("O41_ARTIFACTS_ENDPOINT", raising=False)
    with pytest.raises(artifacts.ConfigError, match="set O41_ARTIFACTS_ENDPOINT or pass"):
        artifacts.Client()
    # the collections without an endpoint are embedded, as before
    embedded = sky.Client.from_environment().transport
    assert isinstance(embedded, sky.EmbeddedTransport)
    embedded.close()


def test_a_value_over_the_limit_is_the_413_class_before_it_is_sent() -> None:
    in_process = sky.EmbeddedTransport()
    embedded = sky.Client(in_process, "job-1")
    error = raised(lambda: embedded.dict("d").__setitem__("big", b"x" * (600 * 1024)))
    in_process.close()
    assert isinstance(error, sky.ValueTooLarge) and isinstance(error, ValueError)
    assert isinstance(error, sky.InvalidRequest) and isinstance(error, sky.CollectionError)
    assert error.status == 413
    assert "value too large" in str(error)


def test_the_filesystem_raises_a_service_that_is_down_never_an_empty_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fsspec takes an OSError in walk and isdir for "no such path"; Unavailable is a
    ConnectionError, and a service that does not answer must not read as nothing there.
    (What it raises after the retries: without them here, else each waits 300 s.)"""
    monkeypatch.setenv("O41_ARTIFACTS_RETRY_DEADLINE", "0")
    fs = fsspec.filesystem(
        "o41",
        endpoint=f"http://{LOOPBACK}:{free_port()}",
        place={"cloud": "aws", "region": "us-east-1", "source": "env"},
        timeout=5,
        skip_instance_cache=True,
    )
    for listing in (
        lambda: fs.find(f"{ORG}/m"),
        lambda: list(fs.walk(f"{ORG}/m")),
        lambda: fs.glob(f"{ORG}/m/*"),
        lambda: fs.isdir(f"{ORG}/m"),
    ):
        assert isinstance(raised(listing), artifacts.TransportError)


async def test_the_filesystem_still_omits_a_path_that_is_not_there(service: Service) -> None:
    fs = fsspec.filesystem(
        "o41",
        endpoint=service.url,
        token_file=str(service.token),
        place={"cloud": "aws", "region": "us-east-1", "source": "env"},
        skip_instance_cache=True,
    )
    assert await asyncio.to_thread(fs.find, f"{ORG}/never-written") == []
    assert await asyncio.to_thread(fs.isdir, f"{ORG}/never-written") is False


def test_configure_takes_what_client_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39, point 7: ``artifacts.configure`` takes every setting ``artifacts.Client``
    takes, by the same names, defaults and kinds (``ca_file``, ``token``,
    ``retry_deadline`` ...), and hands each on."""
    import inspect

    made = inspect.signature(artifacts.Client.__init__).parameters
    configured = inspect.signature(artifacts.configure).parameters
    assert [p for p in made if p != "self"] == list(configured)
    for name, parameter in configured.items():
        assert (parameter.kind, parameter.default) == (made[name].kind, made[name].default), name
    monkeypatch.setattr(artifacts, "_default", None)  # the module's client, as it was after
    client = artifacts.configure(
        "http://127.0.0.1:1", ca_file="/ca.crt", token="t", retry_deadline=7
    )
    assert client.connection.ca_file == "/ca.crt"
    assert client.connection.bearer() == "t"
    assert client.connection.retry_deadline == 7.0
