"""Published token signing keys (public halves) on both backends: upsert by kid, the window, prune."""

from __future__ import annotations

from service.store.base import PublishedKey

X1 = "A" * 43
X2 = "B" * 43


async def test_publish_reads_back_and_updates_only_the_window(store):
    await store.publish_signing_keys([PublishedKey("k1", X1, 100.0, None)], now=100.0)
    assert await store.published_signing_keys(100.0) == [PublishedKey("k1", X1, 100.0, None)]
    # The same kid again: only the window changes (the key of a kid never does).
    await store.publish_signing_keys([PublishedKey("k1", X2, 999.0, 500.0)], now=200.0)
    assert await store.published_signing_keys(200.0) == [PublishedKey("k1", X1, 100.0, 500.0)]
    # Re-published as active (a replica restarted with the same key): the window is gone again.
    await store.publish_signing_keys([PublishedKey("k1", X1, 100.0, None)], now=300.0)
    assert (await store.published_signing_keys(10_000.0))[0].verify_until is None


async def test_keys_past_their_window_are_not_listed_and_are_deleted(store):
    await store.publish_signing_keys([
        PublishedKey("old", X1, 1.0, 50.0),
        PublishedKey("new", X2, 40.0, None),
    ], now=10.0)
    assert [k.kid for k in await store.published_signing_keys(10.0)] == ["old", "new"]
    assert [k.kid for k in await store.published_signing_keys(60.0)] == ["new"]
    await store.publish_signing_keys([], now=60.0)  # any publish prunes closed windows
    assert [k.kid for k in await store.published_signing_keys(0.0)] == ["new"]
