"""The correlation middleware alone, on a bare application."""

from __future__ import annotations

import uuid

import pytest
from aiohttp import web

from service.appkeys import CORRELATION_ID
from service.middleware.correlation import HEADER, correlation_id_for, setup_correlation


async def _echo(request: web.Request) -> web.Response:
    return web.json_response({"seen": request[CORRELATION_ID]})


@pytest.fixture
async def bare(aiohttp_client):
    app = web.Application()
    setup_correlation(app)
    app.router.add_get("/", _echo)
    return await aiohttp_client(app)


@pytest.mark.parametrize(
    "given",
    [
        pytest.param("abc-123", id="simple"),
        pytest.param("trace:01.ab_CD-9", id="all-allowed-punctuation"),
        pytest.param("x" * 128, id="max-length"),
    ],
)
async def test_well_formed_id_is_accepted_and_echoed(bare, given):
    response = await bare.get("/", headers={HEADER: given})
    assert response.headers[HEADER] == given
    assert (await response.json())["seen"] == given


@pytest.mark.parametrize(
    "given",
    [
        pytest.param("x" * 129, id="too-long"),
        pytest.param("has space", id="space"),
        pytest.param("semi;colon", id="semicolon"),
        pytest.param("<script>", id="markup"),
        pytest.param("", id="empty"),
        pytest.param("ünïcode", id="non-ascii"),
    ],
)
async def test_malformed_id_is_replaced_by_a_uuid4(bare, given):
    response = await bare.get("/", headers={HEADER: given.encode("utf-8").decode("latin-1")})
    echoed = response.headers[HEADER]
    assert echoed != given
    assert uuid.UUID(echoed).version == 4
    assert (await response.json())["seen"] == echoed


async def test_missing_id_is_generated(bare):
    response = await bare.get("/")
    assert uuid.UUID(response.headers[HEADER]).version == 4


def test_generated_ids_are_unique():
    assert correlation_id_for(None) != correlation_id_for(None)


def test_a_new_correlation_id_is_a_random_uuid4():
    import uuid

    from service.middleware.correlation import new_uuid4

    seen = set()
    for _ in range(2000):
        text = new_uuid4()
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == text
        seen.add(text)
    assert len(seen) == 2000


def test_a_forked_child_does_not_repeat_its_parents_ids():
    """Ids are made 256 at a time: a child forked with ids left in the pool must not hand out
    the ids its parent will."""
    import os

    from service.middleware.correlation import new_uuid4

    new_uuid4()  # the pool holds ids now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, ",".join(new_uuid4() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split(","))
    os.waitpid(pid, 0)
    parent = {new_uuid4() for _ in range(4)}
    assert len(child) == 4 and not child & parent


def test_the_pools_ids_are_the_uuid4s_of_its_bytes():
    """Each 16 bytes of the OS's give the id ``uuid.UUID(bytes=..., version=4)`` gives them."""
    import os
    import uuid

    from service.middleware.correlation import _uuid4s

    for raw in (os.urandom(4096), bytes(4096), b"\xff" * 4096):
        assert _uuid4s(raw) == [str(uuid.UUID(bytes=raw[i:i + 16], version=4))
                                for i in range(0, len(raw), 16)]
