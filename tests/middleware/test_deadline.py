"""The deadline middleware alone, on a bare application: every store wait of a request comes out
of one ``store.timeout_s``; work that is not a store wait costs nothing."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from service import deadline
from service.config import CONFIG
from service.middleware.deadline import setup_deadline

TIMEOUT_S = 2.0


def _left(timeout_s: float = 60.0) -> float:
    """How long a store call starting now may wait, in this context."""
    return deadline.call_deadline(timeout_s) - asyncio.get_running_loop().time()


async def _waits(request: web.Request) -> web.Response:
    before = _left()
    await asyncio.sleep(0.2)  # not a store wait: costs nothing
    after_work = _left()
    with deadline.charged():  # a store wait
        await asyncio.sleep(0.2)
    after_wait = _left()
    own = _left(0.5)  # a call whose own deadline is sooner keeps it

    async def background() -> float:
        return _left()

    detached = await asyncio.create_task(background(), context=deadline.detached())
    with deadline.unbounded():
        streamed = _left()
    return web.json_response({"before": before, "after_work": after_work,
                              "after_wait": after_wait, "own": own, "detached": detached,
                              "streamed": streamed, "again": _left()})


async def _spent(request: web.Request) -> web.Response:
    with deadline.charged():
        await asyncio.sleep(TIMEOUT_S + 0.1)
    return web.json_response({"left": _left()})


@pytest.fixture
async def bare(aiohttp_client, make_config):
    app = web.Application()
    app[CONFIG] = make_config({"store": {"timeout_s": TIMEOUT_S}})
    setup_deadline(app)
    app.router.add_get("/waits", _waits)
    app.router.add_get("/spent", _spent)
    return await aiohttp_client(app)


async def test_only_store_waits_count_against_the_request(bare):
    seen = await (await bare.get("/waits")).json()
    assert seen["before"] <= TIMEOUT_S
    assert seen["after_work"] > TIMEOUT_S - 0.2  # the sleep outside any store call was free
    assert seen["after_wait"] <= TIMEOUT_S - 0.2  # the charged one was not
    assert seen["own"] <= 0.5
    # A task serving many requests, and a stream's polls, keep each call's own deadline.
    assert seen["detached"] > TIMEOUT_S and seen["streamed"] > TIMEOUT_S
    assert seen["again"] <= TIMEOUT_S - 0.2  # the request's budget is back after the stream


async def test_a_spent_budget_leaves_no_time_for_another_store_call(bare):
    assert (await (await bare.get("/spent")).json())["left"] <= 0.0


def test_outside_any_request_a_call_has_its_own_deadline():
    async def left() -> float:
        return _left(3.0)

    assert asyncio.run(left()) > 2.0


@pytest.mark.parametrize("layers", [False, True], ids=["deadline-alone", "request-layers"])
async def test_the_budget_ends_with_the_request(aiohttp_client, make_config, layers):
    """Code that runs after the request in the same task (a keep-alive connection's next
    request, the response's writing) has no budget left over from it."""
    from service.middleware.layers import setup_layers

    after: list[float] = []

    @web.middleware
    async def outside(request: web.Request, handler):  # type: ignore[no-untyped-def]
        response = await handler(request)
        after.append(_left())
        return response

    app = web.Application()
    app[CONFIG] = make_config({"store": {"timeout_s": TIMEOUT_S}})
    if layers:
        setup_layers(app)
    else:
        setup_deadline(app)
    app.middlewares.insert(0, outside)
    app.router.add_get("/waits", _waits)
    client = await aiohttp_client(app)
    assert (await client.get("/waits")).status == 200
    assert after and after[0] > TIMEOUT_S
