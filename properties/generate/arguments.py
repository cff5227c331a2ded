"""Arguments of the cache operations (docs/spec.md §13): truncation lengths, batch indices, selections and repeat
counts, valid or not.

Each is an ``Argument``: the value, and the error kind it must be rejected with (None: valid).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from ..protocol.kinds import ErrorKind


@dataclass(frozen=True)
class Argument:
    """An argument of a cache operation, and the error kind it must be rejected with (None: valid)."""

    value: object
    problem: str | None  # an ErrorKind value (a plain string: a trace records it as such), or None
    description: str

    @property
    def kind(self) -> ErrorKind | None:
        return None if self.problem is None else ErrorKind(self.problem)


@st.composite
def truncation_lengths(draw: st.DrawFn, length: int, window: int | None = None) -> Argument:
    """``truncate``'s n: mostly valid (0, the length, one below, around a window's edge, or anywhere between);
    else negative, above the length, or not an int (a float, a bool)."""
    if draw(st.integers(0, 3), label="invalid length?") > 0:
        edges = {0, length, length - 1} | ({length - window + d for d in (-1, 0, 1)} if window else set())
        n = draw(st.sampled_from(sorted(e for e in edges if 0 <= e <= length)) | st.integers(0, length), label="n")
        return Argument(n, None, f"n = {n}")
    value = draw(st.sampled_from([-1, -length - 1, length + 1, length + 3, float(length), True, str(length)]),
                 label="invalid n")
    return Argument(value, ErrorKind.INVALID_LENGTH.value, f"n = {value!r}")


@st.composite
def batch_indices(draw: st.DrawFn, batch_size: int) -> Argument:
    """``reorder``'s indices: B ints in [0, B) (repeats, drops, the identity), or one of: a negative index, an
    index of B or more, one index too many or too few, floats, bools."""
    valid = draw(st.lists(st.integers(0, batch_size - 1), min_size=batch_size, max_size=batch_size),
                 label="indices")
    if draw(st.integers(0, 3), label="invalid indices?") > 0:
        as_list = draw(st.booleans(), label="as a list")
        return Argument(valid if as_list else np.array(valid, dtype=np.int64), None, f"indices {valid}")
    problem = draw(st.sampled_from(["negative", "too large", "too many", "too few", "floats", "bools"]),
                   label="problem")
    where = draw(st.integers(0, batch_size - 1), label="where")
    value: object
    if problem in ("negative", "too large"):
        bad = list(valid)
        bad[where] = -1 - where if problem == "negative" else batch_size + where
        value = np.array(bad, dtype=np.int64)
    elif problem == "too many":
        value = np.array([*valid, 0], dtype=np.int64)
    elif problem == "too few":
        value = np.array(valid[:-1], dtype=np.int64)
    elif problem == "floats":
        value = np.array(valid, dtype=np.float64)
    else:
        value = np.array([i % 2 == 0 for i in range(batch_size)])
    return Argument(value, ErrorKind.INVALID_INDICES.value, f"indices {value.tolist()} of {value.dtype} ({problem})")


@st.composite
def listed_or_not(draw: st.DrawFn, arguments: st.SearchStrategy[Argument]) -> Argument:
    """An argument of ``arguments`` as it is, or, half the time where it is invalid indices of ints in an int64
    array, the same ints as a list: an adapter may check the one and wrap the other (numpy's negative indexing of
    a list it converts late). Floats and bools stay arrays."""
    argument = draw(arguments)
    value = argument.value
    if argument.kind is None or not isinstance(value, np.ndarray) or value.dtype != np.int64 \
            or not draw(st.booleans(), label="as a list"):
        return argument
    ints = [int(i) for i in value]
    return Argument(ints, argument.problem, f"{ints} as a list (the ints of {argument.description})")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def length_problem(value: object, length: int) -> ErrorKind | None:
    """What is wrong with ``truncate(value)`` on a cache of ``length`` rows (docs/spec.md §13.2): not an int (a
    bool is not, nor ``2.0``), negative, or above the length is INVALID_LENGTH; None if valid. The rules derive
    the verdict from this and the state they are in, so that a replayed argument is judged where it lands."""
    return None if _is_int(value) and 0 <= int(value) <= length else ErrorKind.INVALID_LENGTH  # type: ignore[call-overload]


def indices_problem(value: object, batch_size: int) -> ErrorKind | None:
    """What is wrong with ``reorder(value)`` on a cache of ``batch_size`` rows (docs/spec.md §13.3): anything but
    ``batch_size`` ints (a list, or a 1-D integer array), each in ``[0, batch_size)``, is INVALID_INDICES."""
    entries = _int_entries(value)
    if entries is None or len(entries) != batch_size or any(not 0 <= i < batch_size for i in entries):
        return ErrorKind.INVALID_INDICES
    return None


def _int_entries(value: object) -> list[int] | None:
    """The ints of a list of ints or a 1-D integer array; None for anything else."""
    if isinstance(value, np.ndarray):
        return [int(i) for i in value.tolist()] if value.ndim == 1 and value.dtype.kind in "iu" else None
    if isinstance(value, list) and all(_is_int(i) for i in value):
        return [int(i) for i in value]
    return None


@st.composite
def batch_selections(draw: st.DrawFn, batch_size: int) -> Argument:
    """``select``'s indices: 1 to B distinct ints in [0, B), increasing (a list or an int64 array); or one of: a
    negative index, an index of B or more, none, floats, bools. An unsorted or repeated selection is never drawn
    (unspecified: docs/spec.md §13.7)."""
    kept = draw(st.lists(st.integers(0, batch_size - 1), min_size=1, max_size=batch_size, unique=True),
                label="kept rows")
    valid = sorted(kept)
    if draw(st.integers(0, 3), label="invalid selection?") > 0:
        as_list = draw(st.booleans(), label="as a list")
        return Argument(valid if as_list else np.array(valid, dtype=np.int64), None, f"rows {valid}")
    problem = draw(st.sampled_from(["negative", "too large", "none", "floats", "bools"]), label="problem")
    value: object
    if problem == "negative":
        value = np.array([-1, *valid[1:]], dtype=np.int64)
    elif problem == "too large":
        value = np.array([*valid[:-1], batch_size], dtype=np.int64)
    elif problem == "none":
        value = np.array([], dtype=np.int64)
    elif problem == "floats":
        value = np.array(valid, dtype=np.float64)
    else:
        value = np.array([True] * len(valid))
    return Argument(value, ErrorKind.INVALID_INDICES.value, f"rows {value.tolist()} of {value.dtype} ({problem})")


def on_purpose(plain: str, *hard: str) -> st.SearchStrategy[str]:
    """Which case a rule meets: ``plain`` half the time (and where shrinking goes), each hard case an equal share
    of the rest -- the hard cases a rule draws on purpose must not crowd out what it met before them."""
    return st.sampled_from((plain,) * len(hard) + hard)


@st.composite
def non_prefix_selections(draw: st.DrawFn, batch_size: int) -> Argument:
    """Valid ``select`` indices (B >= 2) that are not the leading rows ``0..k-1``: 1 to B - 1 distinct ints in
    [0, B), increasing, at least one row before the last kept left out (a list or an int64 array)."""
    if batch_size < 2:
        raise ValueError(f"a selection other than the leading rows needs a batch of 2 or more, not {batch_size}")
    choices = [rows for size in range(1, batch_size) for rows in itertools.combinations(range(batch_size), size)
               if rows != tuple(range(size))]
    valid = list(draw(st.sampled_from(choices), label="kept rows"))
    as_list = draw(st.booleans(), label="as a list")
    return Argument(valid if as_list else np.array(valid, dtype=np.int64), None, f"rows {valid}")


@st.composite
def rearranging_reorders(draw: st.DrawFn, batch_size: int) -> Argument:
    """Valid ``reorder`` indices (B >= 2) that move at least one row: B ints in [0, B), not the identity (a
    permutation, or repeats and drops), as a list or an int64 array."""
    if batch_size < 2:
        raise ValueError(f"a reorder that moves a row needs a batch of 2 or more, not {batch_size}")
    valid = draw(st.lists(st.integers(0, batch_size - 1), min_size=batch_size, max_size=batch_size),
                 label="indices")
    if valid == list(range(batch_size)):  # the identity moves nothing: row 0 takes row 1's place instead
        valid[0] = 1
    as_list = draw(st.booleans(), label="as a list")
    return Argument(valid if as_list else np.array(valid, dtype=np.int64), None, f"indices {valid}")


@st.composite
def negative_indices(draw: st.DrawFn, batch_size: int) -> Argument:
    """Invalid ``reorder`` indices: B ints in [0, B) but one negative, from -B to -1 -- a gather that wraps
    negative indices (numpy's) takes each as a row; as a list or an int64 array."""
    indices = draw(st.lists(st.integers(0, batch_size - 1), min_size=batch_size, max_size=batch_size),
                   label="indices")
    where = draw(st.integers(0, batch_size - 1), label="where")
    indices[where] = draw(st.integers(-batch_size, -1), label="negative index")
    as_list = draw(st.booleans(), label="as a list")
    value = indices if as_list else np.array(indices, dtype=np.int64)
    return Argument(value, ErrorKind.INVALID_INDICES.value, f"indices {indices} (negative)")


def selection_problem(value: object, batch_size: int) -> ErrorKind | None:
    """What is wrong with ``select(value)`` on a cache of ``batch_size`` rows (docs/spec.md §13.7): anything but
    1 to B distinct ints in ``[0, B)`` (a list, or a 1-D integer array) is INVALID_INDICES."""
    entries = _int_entries(value)
    if entries is None or not 1 <= len(entries) <= batch_size or len(set(entries)) != len(entries) or any(
            not 0 <= i < batch_size for i in entries):
        return ErrorKind.INVALID_INDICES
    return None


@st.composite
def repeat_counts(draw: st.DrawFn, batch_size: int, largest_batch: int) -> Argument:
    """``repeat_interleave``'s count: an int from 1 to 3 that keeps the batch within ``largest_batch`` (small
    steps, so that a grown batch can still be repeated), 2 or more where it can; or 0, a negative count, a bool,
    a float."""
    if draw(st.integers(0, 3), label="invalid count?") > 0:
        top = max(1, min(3, largest_batch // batch_size))
        repeats = draw(st.integers(min(2, top), top) | st.just(1), label="repeats")
        return Argument(repeats, None, f"repeats = {repeats}")
    value = draw(st.sampled_from([0, -1, True, 2.0]), label="invalid repeats")
    return Argument(value, ErrorKind.INVALID_INDICES.value, f"repeats = {value!r}")


def repeats_problem(value: object) -> ErrorKind | None:
    """What is wrong with ``repeat_interleave(value)`` (docs/spec.md §13.7): anything but an int >= 1."""
    return None if _is_int(value) and int(value) >= 1 else ErrorKind.INVALID_INDICES  # type: ignore[call-overload]
