"""A layout refused in Python names what the Python caller wrote: the keywords and attributes of
kvtier.Layout and kvtier.Rope (num_kv_heads), never the C++ members behind them (numKvHeads)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

import kvtier

# A C++ member's name as the SDK spells it: a lower-case word followed by capitalised ones.
CAMEL_CASE = re.compile(r"\b[a-z]+(?:[A-Z][a-z0-9]*)+\b")


def refusal(make: Callable[[], object]) -> str:
    """The message of the kvtier.InvalidArgument that `make()` raises."""
    with pytest.raises(kvtier.InvalidArgument) as caught:
        make()
    return str(caught.value)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: kvtier.Layout("m", 0, 2, 8), "num_layers 0 is outside 1..1024"),
        (lambda: kvtier.Layout("m", num_layers=2000, num_kv_heads=2, head_dim=8),
         "num_layers 2000 is outside 1..1024"),
        (lambda: kvtier.Layout("m", 2, 0, 8), "num_kv_heads 0 is outside 1..1024"),
        (lambda: kvtier.Layout("m", num_layers=2, num_kv_heads=2, head_dim=0),
         "head_dim 0 is outside 1..1024"),
        (lambda: kvtier.Layout("m", 2, 2, 8, block_tokens=7), "block_tokens 7 is outside 16..512"),
        (lambda: kvtier.Layout("m", 2, 2, 8, state_bytes=(4 << 30) + 1),
         f"state_bytes {(4 << 30) + 1} exceeds"),
        (lambda: kvtier.Layout("m" * 300, 2, 2, 8), "model_id of 300 bytes exceeds 256"),
        (lambda: kvtier.Layout("m", 2, 2, 8, rope=kvtier.Rope("neox", 3)),
         "rope rotary_dims 3 must be even and in 2..head_dim (8)"),
        (lambda: kvtier.Layout("m", 2, 2, 8, rope=kvtier.Rope("gptj", 16)),
         "rope rotary_dims 16 must be even and in 2..head_dim (8)"),
    ],
)
def test_a_bad_field_is_named_as_python_names_it(make: Callable[[], object],
                                                  expected: str) -> None:
    message = refusal(make)
    assert expected in message
    assert not CAMEL_CASE.findall(message), message


def test_a_model_without_kv_is_explained_in_python_names() -> None:
    # num_layers 0 is allowed only with num_kv_heads and head_dim 0 and a state: the hint says so
    # with the keywords a caller passes.
    message = refusal(lambda: kvtier.Layout("m", 0, 2, 8, state_bytes=1000))
    assert "(0 with num_kv_heads and head_dim 0 only for a layout with a state)" in message
    assert not CAMEL_CASE.findall(message), message
    # And such a layout is accepted.
    layout = kvtier.Layout("m", 0, 0, 0, state_bytes=1000)
    assert not layout.has_kv and layout.state_bytes == 1000
