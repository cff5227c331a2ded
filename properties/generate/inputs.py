"""Inputs a step or a chunk is handed: valid ones in every memory layout, and malformed ones.

A valid row is a float64 ndarray ``[B, 1, D]`` (a chunk ``[B, T, D]``) in
``[-1, 1]``; a malformed one has one or several of the problems a step checks
first (docs/spec.md §4.5), each named in the order they are checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..protocol.kinds import ErrorKind
from .layers import INPUT_BOUND, MAX_MODEL_WIDTH
from .layouts import ORDERS

FORMS = ("uniform", "sparse", "grid")  # of valid input values; the first is what a shrunk row has


@st.composite
def input_arrays(draw: st.DrawFn, shape: tuple[int, ...]) -> np.ndarray:
    """Valid input values of ``shape`` in ``[-1, 1]``, from a drawn seed: uniform; uniform with about half the
    entries 0; or on the grid -1, -0.5, 0, 0.5, 1 (equal values, exact ties).

    Two choices for Hypothesis however large the array, where drawing each entry took three: the search
    spends its time on programs, not on floats (docs/architecture.md, "Speed"). A trace holds the values
    themselves, so nothing depends on the generator that made them."""
    seed = draw(st.integers(0, 2**32 - 1))
    form = draw(st.sampled_from(FORMS))
    rng = np.random.default_rng(seed)
    if form == "grid":
        return np.asarray(rng.integers(-2, 3, shape) / 2.0, dtype=np.float64)
    values = np.asarray(rng.uniform(-INPUT_BOUND, INPUT_BOUND, shape), dtype=np.float64)  # 0-d too
    if form == "sparse":
        values[rng.random(shape) < 0.5] = 0.0
    return values


@cache
def rows(batch_size: int, model_width: int) -> st.SearchStrategy[np.ndarray]:
    """One valid new row ``[B, 1, D]`` in the documented input range."""
    return input_arrays((batch_size, 1, model_width))


@cache
def chunks(batch_size: int, tokens: int, model_width: int) -> st.SearchStrategy[np.ndarray]:
    """``tokens`` valid new rows ``[B, T, D]`` at once, in the documented input range."""
    return input_arrays((batch_size, tokens, model_width))


MAX_CHUNK = 4


def layouts() -> st.SearchStrategy[tuple[str, bool]]:
    """(order, writeable) of a valid row: any layout of a float64 array of the right shape is valid."""
    return st.tuples(st.sampled_from(ORDERS), st.booleans())


# The documented order of a step's input checks (docs/spec.md): the first failing one decides the kind.
INPUT_CHECKS = (ErrorKind.DTYPE, ErrorKind.RANK, ErrorKind.TOKEN_COUNT, ErrorKind.BATCH_MISMATCH,
                ErrorKind.WIDTH_MISMATCH)
NOT_FLOAT64 = ("float32", "float16", "bool", "int8", "int64", "uint8", "complex64", "complex128", "object")
NOT_ARRAYS = ("list", "tuple", "python float", "numpy float64 scalar")


@dataclass(frozen=True, eq=False)
class MalformedRow:
    """An input a step must reject, with every problem it has, in the order they are checked."""

    value: object
    problems: tuple[str, ...]  # ErrorKind values (plain strings: a trace records them as such)
    description: str

    @property
    def kind(self) -> ErrorKind:
        """The kind the first failing check decides."""
        return ErrorKind(self.problems[0])


def other_batches(batch_size: int) -> list[int]:
    """Batch sizes other than the cache's: a single row first (into a batch of 2 or more, a broadcasting write
    takes it), then larger ones, then 0, then the rest."""
    first = [1] if batch_size > 1 else []
    return first + [b for b in (batch_size + 1, batch_size + 2, 0, *range(2, batch_size)) if b not in first]


@st.composite
def malformed_rows(draw: st.DrawFn, batch_size: int, model_width: int, *, chunked: bool = False) -> MalformedRow:
    """A step's input with one or several of: not a float64 ndarray, not 3-D, not one token, another batch
    (0 included), another width (0 included); values in [-1, 1]. ``chunked``: a chunk's input, for which
    any token count >= 1 is valid and only 0 tokens is wrong."""
    # Half the time one problem alone (each reaches its own check; batch and width are the ones a write can get
    # past), else several at once (the order of checks decides).
    kinds = draw(st.one_of(st.sampled_from(INPUT_CHECKS).map(lambda kind: {kind}),
                           st.sets(st.sampled_from(INPUT_CHECKS), min_size=2)), label="problems")
    if ErrorKind.RANK in kinds:  # batch, tokens and width are the axes of a 3-D input only
        kinds -= {ErrorKind.TOKEN_COUNT, ErrorKind.BATCH_MISMATCH, ErrorKind.WIDTH_MISMATCH}
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=2).filter(lambda s: len(s) != 3),
                     label="shape")
    else:
        others = other_batches(batch_size)  # half the time the first: one row into a larger batch, if it can be
        batch = batch_size if ErrorKind.BATCH_MISMATCH not in kinds else draw(
            st.one_of(st.just(others[0]), st.sampled_from(others)), label="batch")
        if chunked:
            tokens = 0 if ErrorKind.TOKEN_COUNT in kinds else draw(st.integers(1, 3), label="tokens")
        else:
            tokens = 1 if ErrorKind.TOKEN_COUNT not in kinds else draw(st.sampled_from([0, 2, 3]), label="tokens")
        width = model_width if ErrorKind.WIDTH_MISMATCH not in kinds else draw(
            st.sampled_from([w for w in range(MAX_MODEL_WIDTH + 2) if w != model_width]), label="width")
        shape = (batch, tokens, width)
    values = draw(input_arrays(shape), label="values")  # values decide nothing: the problems do
    value: object = values
    what = f"float64 array of shape {shape}"
    if ErrorKind.DTYPE in kinds:
        form = draw(st.sampled_from(NOT_FLOAT64 + NOT_ARRAYS), label="not float64")
        if form in ("list", "tuple") and values.ndim == 0:
            form = "python float"  # a 0-d array's tolist() is a scalar
        if form in ("list", "tuple"):
            value = values.tolist() if form == "list" else _tuples(values.tolist())
        elif form == "python float":
            value, kinds = float(values.ravel()[0]) if values.size else 0.5, {ErrorKind.DTYPE}
        elif form == "numpy float64 scalar":
            value, kinds = np.float64(values.ravel()[0] if values.size else 0.5), {ErrorKind.DTYPE}
        elif form.startswith(("int", "uint")):  # unsigned: of |values|, so that nothing wraps out of range
            value = np.asarray(np.rint(np.abs(values) if form.startswith("uint") else values), dtype=form)
        elif form == "bool":
            value = np.asarray(values > 0)
        else:
            value = np.asarray(values, dtype=form)
        what = f"{form} of shape {shape}" if form not in ("python float", "numpy float64 scalar") else form
    problems = tuple(kind.value for kind in INPUT_CHECKS if kind in kinds)
    return MalformedRow(value, problems, f"{what} ({', '.join(problems)})")


@st.composite
def rows_as_lists(draw: st.DrawFn, batch_size: int, model_width: int) -> MalformedRow:
    """A valid row's values ``[B, 1, D]`` as nested Python lists: DTYPE alone (not an ndarray) -- a cache that
    converts a list to an array takes it, which a list of another shape (rejected for that too) may not show."""
    values = draw(rows(batch_size, model_width), label="values")
    problems = (ErrorKind.DTYPE.value,)
    return MalformedRow(values.tolist(), problems, f"list of shape {values.shape} ({problems[0]})")


@st.composite
def single_rows_into_a_batch(draw: st.DrawFn, batch_size: int, model_width: int) -> MalformedRow:
    """One valid float64 row ``[1, 1, D]`` into a cache of ``batch_size`` >= 2 rows: BATCH_MISMATCH alone -- a
    write that broadcasts it into every row of the batch takes it."""
    if batch_size < 2:
        raise ValueError(f"a single row into a larger batch needs a batch of 2 or more, not {batch_size}")
    values = draw(rows(1, model_width), label="values")
    problems = (ErrorKind.BATCH_MISMATCH.value,)
    return MalformedRow(values, problems, f"float64 array of shape {values.shape} ({problems[0]})")


@st.composite
def larger_batches_of_rows(draw: st.DrawFn, batch_size: int, model_width: int) -> MalformedRow:
    """``B + 1`` or ``B + 2`` valid float64 rows ``[B', 1, D]`` into a cache of ``batch_size`` rows: BATCH_MISMATCH
    alone -- a write of the first ``B`` rows takes it (where ``B`` is 1, no single row is wrong)."""
    larger = draw(st.integers(batch_size + 1, batch_size + 2), label="batch")
    values = draw(rows(larger, model_width), label="values")
    problems = (ErrorKind.BATCH_MISMATCH.value,)
    return MalformedRow(values, problems, f"float64 array of shape {values.shape} ({problems[0]})")


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
