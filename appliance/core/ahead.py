"""One item ahead: overlap producing the next item with the caller's use of this one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, islice
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def one_ahead(work: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
    """work(item) for each item in order, done in a worker thread one item ahead of the caller.

    While the caller uses one result and this thread takes the next item, the worker
    computes the following one: no more than two items are in flight, and an exception
    from work is raised here, in order. It pays where work releases the GIL (hashing,
    AES-GCM, SQLite, image decoding, torch).
    """
    items = iter(items)
    head = list(islice(items, 2))
    if len(head) < 2:  # one item: nothing to overlap, so no thread to start
        yield from map(work, head)
        return
    items = chain(head, items)
    del head  # hold no item beyond those in flight
    with ThreadPoolExecutor(max_workers=1) as worker:
        pending = worker.submit(work, next(items))
        for item in items:
            following = worker.submit(work, item)
            yield pending.result()
            pending = following
        yield pending.result()
