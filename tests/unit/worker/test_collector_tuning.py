"""A worker process tunes the cyclic garbage collector once before its event loop: what start-up
created is frozen out of later collections and the youngest generation is collected rarely; cycles
made afterwards are still collected."""

import gc
import weakref
from collections.abc import Iterator

import pytest
from lading_worker import main


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("collector")
def test_start_up_objects_are_frozen_and_young_collections_are_rare() -> None:
    main.tune_collector()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == main.GC_YOUNG_THRESHOLD > 700


@pytest.mark.usefixtures("collector")
def test_a_cycle_made_after_tuning_is_still_collected() -> None:
    main.tune_collector()

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
