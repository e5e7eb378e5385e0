"""Fuzzing the naming rule and the internal keys (marsys_mem.model.names).

Any text given as a name gets a clear :class:`InvalidNameError` or is accepted, fast; the
Python check and the pydantic pattern agree; internal keys never equal a key built from
names, and parse back to what built them; inbox keys never collide.
"""

import time

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError

from marsys_mem.exceptions import InvalidNameError
from marsys_mem.model.names import NAME_PATTERN, inbox_key, is_name, parse_inbox_key, validate_name
from marsys_mem.store.keys import TIERS, facts_key, internal_key, parse_key, validate_key

# text biased towards the characters the rule cares about
_TRICKY = st.sampled_from(list("/+#@\x00\n\x1f\x7f\x85\x9f\ud800\udc80 a.é日😀"))
TEXT = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.one_of(_TRICKY, st.characters()), max_size=20),
    st.text(alphabet="ab", min_size=250, max_size=260),
)
NAME = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/+#@\x85"),
    min_size=1,
    max_size=30,
)


class _Named(BaseModel):
    name: str = Field(pattern=NAME_PATTERN)


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_validate_name_is_a_clear_error_or_success_and_fast(text):
    start = time.perf_counter()
    error = None
    try:
        assert validate_name("agent", text) == text
    except InvalidNameError as exc:
        error = str(exc)
    assert time.perf_counter() - start < 1.0
    assert (error is None) == is_name(text)
    if error is not None:
        assert error.startswith("agent must be 1-256 characters")
        assert len(error) < 300


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_the_pattern_and_the_check_agree(text):
    try:
        _Named(name=text)
        by_pattern = True
    except ValidationError:
        by_pattern = False
    assert by_pattern == is_name(text)


@settings(max_examples=300, deadline=None)
@given(NAME, NAME, NAME, NAME, NAME, NAME)
def test_internal_keys_never_equal_a_key_of_names(ns, agent, branch, a2, b2, b3):
    user_keys = {(ns, a2, b2), (ns, a2, b3), (ns, agent, branch)}
    base = (ns, agent, branch)
    built = [
        internal_key(base, "rag"),
        internal_key(base, "episodes"),
        *(internal_key(base, "tiers", t) for t in TIERS),
        facts_key(ns, branch),
    ]
    assert not user_keys & set(built)
    assert len(set(built)) == len(built)
    for key in built:
        info = parse_key(key)
        assert info.key == key
        assert validate_key(key) == key
        if info.kind != "facts":
            assert info.conversation == base
    assert parse_key(base).kind == "conversation"


@settings(max_examples=300, deadline=None)
@given(NAME, NAME, NAME, NAME)
def test_inbox_keys_are_injective(a1, b1, a2, b2):
    assert parse_inbox_key(inbox_key(a1, b1)) == (a1, b1)
    if (a1, b1) != (a2, b2):
        assert inbox_key(a1, b1) != inbox_key(a2, b2)


@settings(max_examples=300, deadline=None)
@given(TEXT, TEXT, TEXT)
def test_hand_spelled_keys_are_names_or_rejected(ns, agent, branch):
    """A key of plain strings is accepted only when all three are names."""
    error = None
    try:
        validate_key((ns, agent, branch))
    except InvalidNameError as exc:
        error = str(exc)
    assert (error is None) == (is_name(ns) and is_name(agent) and is_name(branch))
    assert error is None or "store key" in error
