"""``Store.get_run_read``: a chain run's session, ticket (with its reviews) and task in one
statement, each None where there is no row, on both backends."""

from __future__ import annotations

from service.store.base import RunRead

from .helpers import T0, review, session, ticket


async def test_the_run_read_finds_each_row_or_none(store):
    await store.create_session(session("s-1"))
    await store.create_ticket(ticket("t-1"))
    await store.add_review("t-1", review("bob"), None, None, T0 + 10)
    await store.add_review("t-1", review("carol", at=T0 + 11), "approved", T0 + 900, T0 + 11)
    await store.ensure_task("task-1", "alice", T0)

    read = await store.get_run_read("s-1", "t-1", "task-1")
    assert isinstance(read, RunRead) and read.ticket_id == "t-1"
    assert read.session == await store.get_session("s-1")
    assert read.ticket == await store.get_ticket("t-1")
    assert read.ticket is not None and read.ticket.state == "approved"
    assert [r.reviewer for r in read.ticket.reviews] == ["bob", "carol"]  # in review order
    assert read.task is not None and read.task.id == "task-1"
    assert read.task.task == await store.get_task("task-1")

    missing = await store.get_run_read("s-unknown", "t-unknown", "task-unknown")
    assert missing.session is None and missing.ticket is None
    assert missing.task is not None and missing.task.id == "task-unknown"
    assert missing.task.task is None

    no_task = await store.get_run_read("s-1", "t-unknown", None)
    assert no_task.session == read.session and no_task.ticket is None and no_task.task is None

    no_session = await store.get_run_read("s-unknown", "t-1", "task-1")
    assert no_session.session is None and no_session.ticket == read.ticket
    assert no_session.task == read.task
