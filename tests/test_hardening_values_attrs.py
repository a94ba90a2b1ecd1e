"""Issue 35 §9 and §13: user attribute values are described without their values and without
their own ``__str__``/``__repr__``; a value that cannot be read loses that attribute, never the
span."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
from transformers import BatchEncoding

import attnscope
from attnscope._record.capture import MAX_VALUE, attribute_value
from attnscope.testing import capture_spans

IDS = torch.tensor([[8123, 7777, 6543]])
SECRETS = ("8123", "7777", "6543")


class _Counted:
    """Counts every call of its own text methods: attnscope must make none."""

    calls = 0

    def __str__(self) -> str:
        type(self).calls += 1
        return "8123"

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return self.__str__()


class _Raises:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    __repr__ = __str__


class _Holder:
    """An arbitrary object holding a tensor (a config, a request)."""

    def __init__(self) -> None:
        self.ids = IDS

    def __repr__(self) -> str:
        return f"_Holder({self.ids!r})"


class _Unreadable(Mapping[str, Any]):
    """A mapping whose own code raises when read."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("cannot iterate")

    def __len__(self) -> int:
        return 1


def _user_attributes(span: Any) -> dict[str, Any]:
    """The attributes a user gave (sequences as lists: the SDK keeps tuples)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()
            if k != "attnscope.summary" and not k.endswith("_ns")
            and k not in ("attnscope.tier", "attnscope.sample_rate",
                          "attnscope.memory.host_rss_bytes", "code.function.name")}


def _no_values(attrs: dict[str, Any]) -> None:
    text = repr(attrs)
    assert not any(secret in text for secret in SECRETS), text


# -- §9: values in spans -------------------------------------------------------------------------

def test_tokens_given_a_tensor_records_its_description_not_its_ids() -> None:
    with capture_spans() as spans:
        with attnscope.span("a", tokens=IDS):  # type: ignore[arg-type]
            pass
    (span,) = spans
    attrs = _user_attributes(span)
    assert attrs == {"attnscope.tokens": "Tensor(shape=(1, 3), dtype=int64)"}
    _no_values(attrs)
    assert attnscope.stats()["worker_errors"] == 0


def test_containers_are_described_by_keys_and_shapes_without_values() -> None:
    encoded = BatchEncoding({"input_ids": IDS, "attention_mask": torch.ones_like(IDS)})
    listed = BatchEncoding({"input_ids": [8123, 7777, 6543], "attention_mask": [1, 1, 1]})
    with capture_spans() as spans:
        with attnscope.span("a", attributes={"enc": encoded, "listed": listed,
                                             "d": {"ids": IDS, "n": 3}, "held": _Holder(),
                                             "ids_list": [IDS, IDS]}):
            pass
        attnscope.trace(name="site", attributes={"enc": encoded, "held": _Holder()})(
            lambda: None)()
    block, site = spans
    attrs = _user_attributes(block)
    assert attrs == {
        "enc": "{input_ids: Tensor(shape=(1, 3), dtype=int64), "
               "attention_mask: Tensor(shape=(1, 3), dtype=int64)}",
        "listed": "{input_ids: list[3], attention_mask: list[3]}",
        "d": "{ids: Tensor(shape=(1, 3), dtype=int64), n: 3}",
        "held": "<_Holder>",
        "ids_list": ["Tensor(shape=(1, 3), dtype=int64)"] * 2,
    }
    assert _user_attributes(site) == {"enc": attrs["enc"], "held": "<_Holder>"}
    for span in spans:
        _no_values(_user_attributes(span))


def test_no_user_str_or_repr_runs_on_either_thread() -> None:
    _Counted.calls = 0
    with capture_spans() as spans:
        with attnscope.span("a", tokens=_Counted(),  # type: ignore[arg-type]
                            attributes={"x": _Counted(), "d": {"y": _Counted()},
                                        "l": [1, _Counted()]}) as block:
            block.set(z=_Counted())
        attnscope.trace(name="site", attributes={"x": _Counted()})(lambda: None)()
    assert len(spans) == 2 and _Counted.calls == 0
    assert _user_attributes(spans[0]) == {"x": "<_Counted>", "d": "{y: <_Counted>}",
                                          "l": ["1", "<_Counted>"],
                                          "attnscope.tokens": "<_Counted>",
                                          "attnscope.z": "<_Counted>"}


class _Watched(torch.Tensor):
    """A tensor subclass that records what torch functions touch it."""

    seen: list[str] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        cls.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]


def test_a_tensor_is_described_from_its_metadata_only() -> None:
    watched = IDS.as_subclass(_Watched)
    _Watched.seen = []
    assert attribute_value(watched) == "_Watched(shape=(1, 3), dtype=int64)"
    assert attribute_value({"ids": watched}) == "{ids: _Watched(shape=(1, 3), dtype=int64)}"
    read = {"__repr__", "__str__", "__format__", "tolist", "item", "numpy", "__getitem__",
            "__iter__", "cpu", "to"}
    assert not read & set(_Watched.seen), _Watched.seen
    meta = torch.empty(2, 5, device="meta", dtype=torch.bfloat16)
    assert attribute_value(meta) == "Tensor(shape=(2, 5), dtype=bfloat16, device=meta)"


class _Color(enum.IntEnum):
    RED = 1


class _Name(str):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_plain_values_stay_values_and_everything_is_bounded() -> None:
    assert attribute_value(3) == 3 and attribute_value(2.5) == 2.5 and attribute_value(True)
    assert attribute_value("x" * 1000) == "x" * MAX_VALUE
    assert attribute_value([1, 2, 3]) == [1, 2, 3] and attribute_value((True,)) == [True]
    assert attribute_value(list(range(100))) == list(range(64))
    assert attribute_value([1, "a"]) == ["1", "a"]
    assert attribute_value(_Color.RED) == "_Color.RED"
    named = attribute_value(_Name("decode"))
    assert named == "decode" and type(named) is str
    assert attribute_value(torch.float16) == "torch.float16"
    big = attribute_value({f"k{i}": torch.zeros(i + 1) for i in range(1000)})
    assert len(big) <= MAX_VALUE and big.startswith("{k0: Tensor(shape=(1,), dtype=float32)")
    deep = attribute_value({"a": {"b": {"c": IDS}}})
    assert deep == "{a: {b: <dict>}}"
    assert attribute_value({_Holder(): 1}) == "{<_Holder>: 1}"


class _Shaped:
    """Looks like an array, but reading its shape raises."""

    dtype = "float32"

    @property
    def shape(self) -> Any:
        raise RuntimeError("broken shape")


def test_a_value_whose_own_code_raises_is_not_described_as_something_else() -> None:
    for value in (_Shaped(), {"x": _Shaped()}, _Unreadable()):
        with pytest.raises(RuntimeError):
            attribute_value(value)


# -- §13: a value that cannot be read loses that attribute only ----------------------------------

def test_an_attribute_whose_str_raises_keeps_its_span() -> None:
    with capture_spans() as spans:
        with attnscope.span("a", attributes={"bad": _Raises(), "good": 1}):
            pass
        attnscope.trace(name="site", attributes={"bad": _Raises(), "good": 2})(lambda: None)()
    assert [s.name for s in spans] == ["a", "site"]
    assert _user_attributes(spans[0]) == {"bad": "<_Raises>", "good": 1}
    assert _user_attributes(spans[1]) == {"bad": "<_Raises>", "good": 2}
    assert attnscope.stats()["worker_errors"] == 0


@pytest.mark.internal_errors("attributes")
def test_a_value_that_raises_when_read_is_left_out_alone() -> None:
    with capture_spans() as spans:
        with attnscope.span("a", attributes={"bad": _Unreadable(), "good": 1}):
            pass
        attnscope.trace(name="site", attributes={"bad": _Unreadable(), "good": 2})(
            lambda: None)()
    assert [s.name for s in spans] == ["a", "site"]
    assert _user_attributes(spans[0]) == {"good": 1}
    assert _user_attributes(spans[1]) == {"good": 2}
    stats = attnscope.stats()
    assert stats["worker_errors"] == 0 and stats["internal_errors"] >= 1


def test_an_int_tokens_still_gives_a_rate() -> None:
    with capture_spans() as spans:
        with attnscope.span("a", tokens=7):
            pass
    (span,) = spans
    attrs: dict[str, Any] = dict(span.attributes or {})
    assert attrs["attnscope.tokens"] == 7 and attrs["attnscope.tokens_per_s"] > 0
