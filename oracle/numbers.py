"""The number systems the oracle runs in, behind one small interface.

The oracle's arithmetic is written once, with ``+ - * /`` on scalars and the
handful of functions below. ``FLOAT64`` makes those scalars Python floats
(IEEE binary64); ``mpmath_precision(digits)`` makes them ``mpf`` values of a
*local* mpmath context, so high precision never touches the global ``mp.dps``.
``numpy_precision(dtype)`` rounds every operation to a low-precision dtype:
not a ground truth, but the naive baseline low-precision implementations are
judged against. ``mixed_precision(components)`` is float64 with some of the
oracle's components (``COMPONENTS``) computed in a low-precision dtype: the
naive baseline of a float64 model with, say, a float32 RoPE table, or its
whole rotation in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import mpmath
import numpy as np


@dataclass(frozen=True)
class NumberSystem:
    """Scalar constructor and elementary functions for one precision."""

    name: str
    number: Callable[[float], Any]  # exact conversion of a float64 input
    exp: Callable[[Any], Any]
    cos: Callable[[Any], Any]
    sin: Callable[[Any], Any]
    sqrt: Callable[[Any], Any]
    tanh: Callable[[Any], Any]
    to_float: Callable[[Any], float]  # round back to float64 for comparison
    is_finite: Callable[[Any], bool]
    # components of the oracle computed in another number system, as (component, system) pairs
    components: tuple[tuple[str, NumberSystem], ...] = ()
    reads_errors: bool = False  # to_float reads the error a dtype's evaluations may have, not a value (rounding.py)
    # (x, radius) -> x, known to lie within [-radius, radius] in every evaluation: bounds an estimated error
    # (rounding.py); None: the values are the computation's own, nothing to bound
    within: Callable[[Any, Any], Any] | None = None
    # the softmax as a whole (rounding.py's estimate over uncertain scores); None: operation by operation
    softmax: Callable[[list[Any]], list[Any]] | None = None

    def component(self, name: str) -> NumberSystem:
        """The number system the oracle's component ``name`` runs in: its own unless overridden."""
        return dict(self.components).get(name, self)


FLOAT64 = NumberSystem(
    name="float64",
    number=float,
    exp=math.exp,
    cos=math.cos,
    sin=math.sin,
    sqrt=math.sqrt,
    tanh=math.tanh,
    to_float=float,
    is_finite=math.isfinite,
)


def mpmath_precision(digits: int = 40) -> NumberSystem:
    """A number system of ``digits`` significant decimal digits.

    Each call owns a fresh ``mpmath.MPContext``; float64 inputs convert to it
    exactly, so the only rounding is the context's own.
    """
    if not isinstance(digits, int) or isinstance(digits, bool) or digits < 16:
        raise ValueError(f"mpmath precision needs an int of at least 16 digits, got {digits!r}")
    ctx = mpmath.MPContext()
    ctx.dps = digits
    return NumberSystem(
        name=f"mpmath{digits}",
        number=ctx.mpf,
        exp=ctx.exp,
        cos=ctx.cos,
        sin=ctx.sin,
        sqrt=ctx.sqrt,
        tanh=ctx.tanh,
        to_float=float,
        is_finite=lambda value: bool(ctx.isfinite(value)),
    )


LOW_PRECISIONS = ("float32", "float16", "bfloat16")


def numpy_precision(dtype: str) -> NumberSystem:
    """Every scalar operation rounded to ``dtype`` (``float32``, ``float16`` or ``bfloat16``).

    Not ground truth: the naive computation in a low-precision dtype, whose
    error against mpmath is the budget a low-precision implementation is
    judged by (``properties/tolerance.py``). Relies on NumPy 2's promotion
    rules: a Python number meeting a NumPy scalar takes the scalar's dtype.
    bfloat16 is ``ml_dtypes.bfloat16`` (NumPy has none).
    """
    if dtype not in LOW_PRECISIONS:
        raise ValueError(f"dtype must be one of {LOW_PRECISIONS}, got {dtype!r}")
    if dtype == "bfloat16":
        import ml_dtypes

        scalar: Any = ml_dtypes.bfloat16
    else:
        scalar = getattr(np, dtype)
    return NumberSystem(
        name=dtype,
        number=scalar,
        exp=np.exp,
        cos=np.cos,
        sin=np.sin,
        sqrt=np.sqrt,
        tanh=np.tanh,
        to_float=float,
        is_finite=lambda value: bool(np.isfinite(value)),
    )


# "rope": the cos/sin table (angles, cos and sin); "softmax": exp, sum and division; "rotation": the table and the
# rotation itself (the rotated features rounded to the dtype, multiplied and summed there, converted back);
# "transcendentals": every exp, cos, sin and tanh of that dtype's accuracy -- the argument rounded to it, the
# function computed there, the result back in float64 -- with all the arithmetic around them in float64;
# "norm": a whole model's RMSNorm, x / sqrt(mean(x^2) + eps) with x rounded to the dtype and computed there, the
# result back in float64 before the weight multiplies it (transformers' LlamaRMSNorm in a float64 model)
COMPONENTS = ("rope", "softmax", "rotation", "transcendentals", "norm")
# Not a mixed precision of a float64 model: a low-precision computation whose gate activation is read from a table of
# a narrower dtype (the argument and the value rounded to it; ggml's CPU GELU, a float16 table): ``with_table``.
ACTIVATION_TABLES = ("float16",)


def with_activation_table(numbers: NumberSystem, table: str) -> NumberSystem:
    """``numbers`` with its gate activation read from a ``table`` (``ACTIVATION_TABLES``) table."""
    if table not in ACTIVATION_TABLES:
        raise ValueError(f"an activation table must be one of {ACTIVATION_TABLES}, got {table!r}")
    return replace(numbers, name=f"{numbers.name} with its activation from a {table} table",
                   components=(*numbers.components, ("activation", numpy_precision(table))))


def mixed_precision(components: Mapping[str, str]) -> NumberSystem:
    """Float64 with each named component computed in a low-precision dtype, e.g. ``{"rope": "float32"}``.

    The component's inputs are rounded to its dtype and its results converted
    back to float64 scalars (``oracle.attention``); everything else is float64.
    """
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"mixed precision components must be among {COMPONENTS}, got {sorted(unknown)}")
    if "rope" in components and "rotation" in components:
        raise ValueError("mixed precision: 'rotation' computes the RoPE table in its dtype too; declare one of "
                         "'rope' (the table only) and 'rotation'")
    pairs = tuple((name, numpy_precision(components[name])) for name in COMPONENTS
                  if name in components and name != "transcendentals")
    base = FLOAT64 if "transcendentals" not in components else _with_functions_of(
        numpy_precision(components["transcendentals"]))
    if not pairs and base is FLOAT64:
        return FLOAT64
    described = ", ".join(f"{name} in {components[name]}" for name in COMPONENTS if name in components)
    return replace(base, name=f"float64 with {described}", components=pairs)


def _with_functions_of(low: NumberSystem) -> NumberSystem:
    """Float64 whose transcendental functions are ``low``'s, on the argument rounded to it."""

    def lowered(function: Callable[[Any], Any]) -> Callable[[float], float]:
        return lambda x: float(function(low.number(x)))

    return replace(FLOAT64, exp=lowered(low.exp), cos=lowered(low.cos), sin=lowered(low.sin),
                   tanh=lowered(low.tanh))
