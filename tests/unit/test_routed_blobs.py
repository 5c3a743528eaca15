"""Several blob stores as one (events/blobs.py ``RoutedBlobStores``): new objects go to the
configured store, a reference is read and deleted where it says it lives."""

from __future__ import annotations

import pytest

from events.blobs import BlobNotFound, MemoryBlobStore, RoutedBlobStores


class Other(MemoryBlobStore):
    kind = "other"


async def test_new_objects_go_to_the_writer_and_each_reference_reads_from_its_own_store() -> None:
    old, new = Other(), MemoryBlobStore()
    earlier = await old.put(b"written before the switch")
    routed = RoutedBlobStores(new, old)
    assert routed.kind == "memory"
    assert routed.members == (new, old)
    later = await routed.put(b"written after")
    assert later.store == "memory"
    assert await new.get(later) == b"written after"
    assert await routed.get(earlier) == b"written before the switch"
    assert await routed.get(later) == b"written after"


async def test_a_reference_to_a_store_not_configured_is_no_object_and_deletes_nothing() -> None:
    store = MemoryBlobStore()
    ref = await store.put(b"bytes")
    elsewhere = ref.model_copy(update={"store": "s3-claim-check"})
    routed = RoutedBlobStores(store)
    with pytest.raises(BlobNotFound, match="no object"):
        await routed.get(elsewhere)
    await routed.delete(elsewhere)
    assert await routed.get(ref) == b"bytes"
    await routed.delete(ref)
    with pytest.raises(BlobNotFound):
        await routed.get(ref)
