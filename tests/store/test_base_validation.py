from datetime import timedelta

import pytest

from marsys_mem import Message
from marsys_mem.store import InMemoryStore
from marsys_mem.store.base import EnforceRetention, Load

KEY = ("ns", "agent", "main")


@pytest.fixture
def store():
    with InMemoryStore() as s:
        s.append_messages(KEY, [Message.user("a", message_id="m1")])
        yield s


def test_a_single_string_is_not_taken_as_ids(store):
    with pytest.raises(TypeError, match="single str"):
        store.delete_messages(KEY, ids="m1")
    assert store.count_messages(KEY) == 1


@pytest.mark.parametrize("bad", [True, -1, 2.5, "3"])
def test_last_must_be_a_non_negative_int(store, bad):
    with pytest.raises(ValueError, match="last"):
        store.batch([Load(KEY, None, bad)])


@pytest.mark.parametrize("bad", [True, 0, 2.5])
def test_max_messages_must_be_a_positive_int(store, bad):
    with pytest.raises(ValueError, match="max_messages"):
        store.enforce_retention(KEY, max_messages=bad)
    assert store.count_messages(KEY) == 1


def test_ttl_must_be_a_timedelta(store):
    with pytest.raises(ValueError, match="ttl"):
        store.enforce_retention(KEY, ttl=30)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="now"):
        store.batch([EnforceRetention(KEY, timedelta(days=1), None, None)])  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["namespace", "agent", "parent_id"])
def test_list_filters_must_be_strings(store, field):
    with pytest.raises(ValueError, match=field):
        store.list_runs(**{field: ""})
    with pytest.raises(ValueError, match="namespace"):
        store.list_keys(namespace=3)  # type: ignore[arg-type]


async def test_async_twins_of_count_and_lists(store):
    assert await store.acount_messages(KEY) == 1
    assert await store.alist_keys() == [KEY]
    assert await store.alist_runs() == []
