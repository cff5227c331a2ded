"""How close is close enough: one rule per declared dtype, stated in every report.

- ``float64`` (the default): every output and cached row within 1e-12
  absolute of the oracle, on the documented input ranges
  (``generate/``). This never loosens, but for a whole model whose own float64 rounding may come near it
  (``Judge.for_weights``, docs/spec.md §15.6): its logits token by token within ``FACTOR`` times the estimate
  of any correct float64 evaluation's error, plus ``ABSOLUTE``.
- ``float32``, ``float16``, ``bfloat16``: the error any correct evaluation in the dtype may have, not what
  one evaluation happened to have. The oracle's own computation runs over scalars that carry, beside their
  value, the rounding error an evaluation of them in the dtype may have, whatever its summation order,
  blocking or fusion (``oracle.rounding_errors``: running error analysis, errors combined as independent
  random quantities); the implementation's worst error against the oracle may be at most ``FACTOR`` times
  the largest of those estimates over the compared array, plus a floor of ``FLOOR_ULPS`` units in the last
  place of the dtype at the expected values' magnitude.

Why not the naive evaluation's own error (FlashAttention's rule, until change 37 of docs/spec.md): on one
input it is one sample, sometimes a lucky one. A textbook float32 Llama with no cache failed the model
machine by 2.5e-6 where the naive evaluation erred by 1.4e-7. Measured by ``python bench/run.py --only
margins``: correct float32 layers and models of other summation orders, blockings and fusions, and the
oracle evaluated with every operation rounded in a random direction, err by at most a third of the
estimate at model level (and at most 1.3 times it per layer output row): error / tolerance stays below
0.7.

- ``float64`` with ``mixed_precision`` components (a float64 model whose
  RoPE table or softmax runs in float32, e.g. Hugging Face's
  ``LlamaRotaryEmbedding``): results still float64 arrays; every error at
  most ``FACTOR`` times the error of the oracle's own computation with just
  those components in their dtype (``oracle.mixed_precision``), plus
  ``FLOOR_ULPS`` ulps of the coarsest declared dtype at the expected
  magnitude, plus the float64 floor ``ABSOLUTE``.

Why that floor too: the naive run is lucky as often here. ``python bench/run.py
--only mixed`` (4,520 steps at positions 0..10 of each example adapter of
``examples/minimal_adapter.py``): error / (2 x naive + 1e-12) reaches 29.7
for the float32 RoPE table (over 1 in 2-3% of steps: its inverse
frequencies, from numpy's vectorised float32 ``pow``, are sometimes an ulp
from the oracle's, and a lucky oracle table is off by far less) and 9.4 for
the float32 softmax; the floor that takes is 2.7 and 0.6 float32 ulps, and
error / tolerance with 8 ulps reaches 0.43 and 0.16. The float32 rotation
(table and products, ``{"rotation": "float32"}``): 27.4 bare, a floor of 3.5
ulps, error / tolerance 0.52. The floor needed grows
with the position (the angle's error does): 5.3 ulps at positions up to 62
(error / tolerance 0.85), so the rule is calibrated for the suite's short
sequences, not for long contexts. Float32 transcendentals (``{"transcendentals":
"float32"}``: exp, cos, sin and tanh on the argument rounded to float32):
the example does what the baseline does, 0.5 bare, error / tolerance 0.38
at positions up to 62; functions float32-accurate on the float64 argument
(the bench's "result rounded" style) are luckier than the baseline (1006
bare at position 0), take a floor of 0.51 ulps, error / tolerance 0.11.

- quantized or low-precision **storage** (an adapter's ``storage`` mapping,
  e.g. ``{"format": "float8_e4m3fn", "scale": "per_tensor", "update":
  "frozen"}``; ``oracle.storage``): computation in float64 (or the declared
  dtype), K/V rows stored rounded. Every error at most ``FACTOR`` times the
  error of the oracle's computation over exactly what such a cache stores
  (same format, same scale rule), plus ``STORAGE_FLOOR_UNITS`` units of the
  format -- an ulp for a float format, one quantization step for an integer
  one, ``1/levels`` for affine groups (whatever their zero point), ``1/127``
  or ``1/8`` for a block format (whether cut per head or along the kv row),
  relative to the expected magnitude -- plus the dtype's own floor; cached
  rows, one step at each element (``StorageFormat.steps``: for affine groups
  with the larger extreme exact, the rescaled step ``|e| / k``).
  Measured by ``python bench/run.py --only storage`` (numbers in the
  module's constants below and docs/spec.md §13.6).
  A whole model's cache (``kv_storage`` narrower than the computation,
  ``for_model``) is judged otherwise (docs/spec.md §15.6): each token's
  logits within ``FACTOR`` times the largest error any correct evaluation
  may have, estimated as the dtype rule estimates it, every stored element
  carrying the error any correct store may have there
  (``oracle.rounding.EstimatedStorage``; a key once more per move), plus
  ``STORAGE_FLOOR_UNITS`` units of the format and ``FLOOR_ULPS`` ulps of
  the dtype at that token's logits: one naive
  evaluation over one store was lucky on some inputs (honest engines failed
  1 to 3 of 16 random seeds). ``python bench/run.py --only storage-margins``.

An adapter declares its dtype with an optional ``dtype`` attribute, and a
float64 adapter its lower-precision components with an optional
``mixed_precision`` mapping, e.g. ``{"rope": "float32"}``
(``declared_precision``). Ground truth is the ``--oracle`` (float64 by
default: within 1e-13 of mpmath, ``test_precision.py``, far below any
low-precision budget).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Generic, TypeVar

import numpy as np

from ..oracle import (
    COMPONENTS,
    FLOAT64,
    ModelConfig,
    ModelWeights,
    NumberSystem,
    StorageFormat,
    mixed_precision,
    numpy_precision,
    rounding_errors,
)
from ..oracle.model import full_model
from ..oracle.numbers import with_activation_table
from ..protocol.declarations import check_precision, declared_precision, declared_storage
from ..protocol.model import declared_activation_table, declared_kv_format
from .checks import assert_close
from .failures import NonConformance

ABSOLUTE = 1e-12  # float64, on the documented ranges
FACTOR = 2.0  # |out - ref| <= 2 x the baseline's error (FlashAttention's tests, for a naive baseline)
FLOOR_ULPS = 8.0
STORAGE_FLOOR_UNITS = 1.0  # bench/run.py --only storage
PROBE_TOKENS = 4  # Judge.for_weights: a float64 model's conditioning, probed on this many tokens
PROBE_MARGIN = 10.0  # ... and judged by its estimate once that comes within this factor of ABSOLUTE
_EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Reference(Generic[T]):
    """The oracle's answer, and for low-precision rules the naive same-dtype computation of it."""

    truth: T
    naive: T | None


@dataclass
class Judge:
    """Applies the rule of one dtype; the machines route every numeric comparison through it.

    ``worst`` is the (error, tolerance) of the comparison that came closest to failing.
    """

    dtype: str
    oracle: NumberSystem
    worst: tuple[float, float] = (0.0, ABSOLUTE)
    components: Mapping[str, str] = field(default_factory=dict)  # declared mixed_precision: component -> dtype
    storage: StorageFormat | None = None  # declared storage format of the cached rows
    activation_table: str | None = None  # a whole model's gate activation read from a table of this dtype
    # a whole model's cache (docs/spec.md §15.6): its storage judged by the errors any correct store may have
    # (rounding_errors over oracle.rounding.EstimatedStorage), not by one naive evaluation over one store
    estimates_storage: bool = False
    # a float64 model whose own rounding may come near ABSOLUTE (for_weights): judged by its estimate, token by token
    estimates_float64: bool = False

    def __post_init__(self) -> None:
        self.components = check_precision(self.dtype, self.components)

    @classmethod
    def for_adapter(cls, adapter: Any, oracle: NumberSystem, *, layer_caches: bool = True) -> Judge:
        """The judge of what ``adapter`` declares (``dtype``, ``mixed_precision``, and for its layer caches
        ``storage``: docs/spec.md §13.6 declares how layer caches store rows; a decoder's, a store's and a
        paged pool's rows are judged by the dtype rule, ``layer_caches=False``)."""
        dtype, components = declared_precision(adapter)
        return cls(dtype, oracle, components=components,
                   storage=declared_storage(adapter) if layer_caches else None)

    @classmethod
    def for_model(cls, adapter: Any, oracle: NumberSystem) -> Judge:
        """The judge of a whole model (docs/spec.md §15.6): its ``dtype``, and its ``kv_storage`` as a storage
        format where the cache is narrower than the computation (the naive baseline then reads every key and
        value through it: ``oracle.model.kv_storage_of(judge.kv_storage, judge.naive)``)."""
        dtype, components = declared_precision(adapter)
        return cls(dtype, oracle, components=components, storage=declared_kv_format(adapter),
                   activation_table=declared_activation_table(adapter), estimates_storage=True)

    def for_weights(self, config: ModelConfig, weights: ModelWeights) -> Judge:
        """This whole-model judge for one drawn model (docs/spec.md §15.6). A float64 model is judged at
        ``ABSOLUTE`` unless a correct float64 evaluation of it may come near that: where ``FACTOR`` times the
        estimate of its rounding errors on a probe prompt (``PROBE_TOKENS`` tokens from position 0) passes
        ``ABSOLUTE / PROBE_MARGIN``, each token's logits are judged by their own estimate instead. Deep and
        Gemma-style models get there (a 7-layer Gemma 3: estimates up to 6.4e-12), and 12 of 150 models drawn for
        the reference (1-2 Llama layers). Every other judge is returned as it is."""
        if not (self.estimates_storage and self.dtype == "float64" and not self.components
                and self.storage is None and self.activation_table is None):
            return self
        probe = full_model([t % config.vocab for t in range(PROBE_TOKENS)], config, weights,
                           numbers=rounding_errors("float64", whole_model=True))
        if FACTOR * float(np.max(probe)) <= ABSOLUTE / PROBE_MARGIN:
            return self
        return replace(self, estimates_float64=True)

    @property
    def kv_storage(self) -> str:
        """The element type of a whole model's cache, as this judge reads it."""
        return self.dtype if self.storage is None else self.storage.format

    @cached_property
    def naive(self) -> NumberSystem | None:
        """The number system of the baseline the budget is measured on (None: a fixed 1e-12): the naive
        computation (its readout values, whose error is the budget), or for a dtype computed throughout
        without narrower storage the rounding errors any evaluation in it may have (its readout the errors)."""
        if self.components:
            return mixed_precision(self.components)
        if self.estimates_float64:
            return rounding_errors("float64", whole_model=True)
        if self.estimates_storage and self.storage is not None and self.activation_table is None:
            return rounding_errors(self.dtype, whole_model=True)
        if self.dtype == "float64":
            return FLOAT64 if self.storage is not None else None
        if self.activation_table is not None:  # the naive computation through the table (docs/spec.md §15.6)
            return with_activation_table(numpy_precision(self.dtype), self.activation_table)
        return numpy_precision(self.dtype) if self.storage is not None else rounding_errors(self.dtype)

    @property
    def rule(self) -> str:
        if self.activation_table is not None:
            stored = "" if self.storage is None else f", K/V stored as {self.storage.format}"
            return (f"{self.dtype} computation{stored}, the gate activation read from a {self.activation_table} "
                    f"table: |error| <= {FACTOR:g} x |error of the full-prefix computation so| + "
                    f"{STORAGE_FLOOR_UNITS:g} {self.activation_table} unit(s) per table and cache at the expected "
                    f"magnitude + {FLOOR_ULPS:g} {self.dtype} ulps, against the {self.oracle.name} oracle")
        if self.storage is not None and self._per_token:
            return (f"{self.dtype} computation, K/V stored as {self._storage_words}: each token's |error| <= "
                    f"{FACTOR:g} x the largest error any correct evaluation of its logits may have (estimated from "
                    f"each step's condition: every stored element off by up to half a step, a key once per move, "
                    f"the {self.dtype} rounding of every operation) + {STORAGE_FLOOR_UNITS:g} "
                    f"{self.storage.format} unit(s)"
                    + (f" + {FLOOR_ULPS:g} {self.dtype} ulps" if self.dtype != "float64" else f" + {ABSOLUTE:.0e}")
                    + f" at its logits' magnitude, against the {self.oracle.name} oracle")
        if self.storage is not None:
            return (f"{self.dtype} computation, K/V stored as {self._storage_words}: "
                    f"|error| <= {FACTOR:g} x |error of the full-prefix computation over what such a cache stores| "
                    f"+ {STORAGE_FLOOR_UNITS:g} {self.storage.format} unit(s) at the expected magnitude"
                    + (f" + {FLOOR_ULPS:g} {self.dtype} ulps" if self.dtype != "float64" else f" + {ABSOLUTE:.0e}")
                    + f", against the {self.oracle.name} oracle")
        if self.components:
            parts = ", ".join(f"{name} in {self.components[name]}" for name in COMPONENTS if name in self.components)
            return (f"float64 with {parts} (mixed_precision): |error| <= {FACTOR:g} x |error of the full-prefix "
                    f"computation with {parts}| + {FLOOR_ULPS:g} {self._floor_dtype} ulps at the expected magnitude "
                    f"+ {ABSOLUTE:.0e}, against the {self.oracle.name} oracle")
        if self.estimates_float64:
            return (f"float64, a model whose own rounding may come near {ABSOLUTE:.0e}: each token's |error| <= "
                    f"{FACTOR:g} x the largest error any correct float64 evaluation of its logits may have "
                    f"(estimated from each step's condition) + {ABSOLUTE:.0e}, against the {self.oracle.name} oracle")
        if self.dtype == "float64":
            return f"float64: |error| <= {ABSOLUTE:.0e} absolute against the {self.oracle.name} oracle"
        return (f"{self.dtype}: |error| <= {FACTOR:g} x the rounding error any {self.dtype} evaluation of the "
                f"full-prefix computation may have (estimated from each step's condition) + {FLOOR_ULPS:g} "
                f"{self.dtype} ulps at the expected magnitude, against the {self.oracle.name} oracle")

    @property
    def _storage_words(self) -> str:
        """The declared storage, as the rule states it."""
        rule = self.storage
        assert rule is not None
        scale = (f"groups of {rule.group}" + (f", steps >= {rule.min_step:g}" if rule.min_step else "")
                 + {"minimum": "", "level": ", zero point on a level",
                    "extreme": ", larger extreme exact, 0 on a level"}[rule.zero_point]
                 if rule.scale == "per_group" else
                 f"blocks of 32 along each {'head' if rule.along == 'head' else 'token'}'s "
                 f"{'row' if rule.along == 'head' else 'whole kv row'}, float16 scales" if rule.scale == "per_block"
                 else f"scale {rule.scale}, {rule.update}")
        return f"{rule.format} ({scale})"

    def reference(self, compute: Callable[[NumberSystem], T],
                  stored: Callable[[NumberSystem], T] | None = None) -> Reference[T]:
        """The oracle's answer and the naive one; with declared storage, ``stored`` computes the naive one
        over what the cache stores (required then)."""
        numbers = self.naive
        if numbers is None:
            return Reference(compute(self.oracle), None)
        if self.storage is not None:
            if stored is None:
                raise TypeError("a judge of declared storage needs the stored computation")
            return Reference(compute(self.oracle), stored(numbers))
        return Reference(compute(self.oracle), compute(numbers))

    def tolerance(self, expected: np.ndarray, naive: np.ndarray | None) -> float | np.ndarray:
        if naive is None or (self.dtype == "float64" and not self.components and self.storage is None
                             and not self.estimates_float64):
            return ABSOLUTE
        baseline = np.asarray(naive, dtype=np.float64)
        error = baseline if self.naive is not None and self.naive.reads_errors else np.abs(baseline - expected)
        if self._per_token and error.ndim == 2 and error.shape[0] > 1:  # each token's logits by their own estimate
            return np.array([[self.tolerance(row[None], err[None])] for row, err in zip(expected, error)])
        budget = float(np.max(np.where(np.isfinite(error), error, np.inf), initial=0.0))
        scale = float(np.max(np.abs(expected), initial=1.0))
        table = 0.0 if self.activation_table is None else STORAGE_FLOOR_UNITS * StorageFormat(
            self.activation_table, "none").unit * scale  # one unit of the table, as of a narrower cache
        if self.estimates_float64:
            return FACTOR * budget + ABSOLUTE
        if self.storage is not None:
            floor = STORAGE_FLOOR_UNITS * self.storage.unit * scale + (
                FLOOR_ULPS * _EPS[self.dtype] * scale if self.dtype != "float64" else ABSOLUTE)
            return float(FACTOR * budget + floor + table)
        floor = FLOOR_ULPS * _EPS[self._floor_dtype] * scale + table
        return FACTOR * budget + floor + (ABSOLUTE if self.components else 0.0)

    @property
    def _per_token(self) -> bool:
        """A whole model's logits over a quantized cache are judged token by token (each token's row of logits
        against its own estimate): a batch's first token has seen few stored cells, its last many."""
        return self.estimates_float64 or (self.estimates_storage and self.storage is not None
                                          and self.activation_table is None)

    @property
    def _floor_dtype(self) -> str:
        """The dtype whose ulps make the floor: the declared one, or the coarsest mixed-precision component's."""
        return max(self.components.values(), key=_EPS.__getitem__) if self.components else self.dtype

    def bound(self, reference: Reference[T],
              select: Callable[[T], np.ndarray]) -> tuple[np.ndarray, float | np.ndarray]:
        """The expected array ``select(reference.truth)`` and this rule's tolerance for it."""
        expected = select(reference.truth)
        return expected, self.tolerance(expected, None if reference.naive is None else select(reference.naive))

    def close(self, actual: Any, expected: np.ndarray, tolerance: float | np.ndarray, *, what: str, check: str,
              axes: Sequence[str] = ("batch", "head", "position", "feature")) -> float:
        """``assert_close`` with this rule's dtype check, remembering the closest call to the tolerance."""
        __tracebackhide__ = True
        try:
            error, limit = assert_close(actual, expected, tolerance=tolerance, what=what, check=check, axes=axes,
                                        dtype=np.float64 if self.dtype == "float64" else None)
        except NonConformance:
            if isinstance(actual, np.ndarray) and actual.shape == expected.shape and actual.size:
                errors = np.nan_to_num(np.abs(actual.astype(np.float64) - expected), nan=np.inf)
                limits = np.broadcast_to(np.asarray(tolerance, dtype=np.float64), expected.shape)
                worst = np.unravel_index(int(np.argmax(errors / np.maximum(limits, 1e-300))), errors.shape)
                self._observe(float(errors[worst]), float(limits[worst]))
            raise
        self._observe(error, limit)
        return error

    def rows_bound(self, reference: Reference[T], select: Callable[[T], np.ndarray],
                   steps: np.ndarray | None) -> tuple[np.ndarray, float | np.ndarray]:
        """``bound`` for cached rows. With declared storage, one tolerance per element: ``FACTOR`` times the
        naive stored row's error there, plus ``STORAGE_FLOOR_UNITS`` of that element's quantization step
        (``steps``, from ``StorageFormat.steps``): a coarser scale than declared shows here."""
        expected, tolerance = self.bound(reference, select)
        if self.storage is None or steps is None or reference.naive is None:
            return expected, tolerance
        naive = np.asarray(select(reference.naive), dtype=np.float64)
        extra = FLOOR_ULPS * _EPS[self.dtype] * np.abs(expected) if self.dtype != "float64" else ABSOLUTE
        return expected, FACTOR * np.abs(naive - expected) + STORAGE_FLOOR_UNITS * steps + extra

    def _observe(self, error: float, tolerance: float) -> None:
        if tolerance > 0:
            self.worst = closer_to_failing((error, tolerance), self.worst)


def closer_to_failing(candidate: tuple[float, float], worst: tuple[float, float]) -> tuple[float, float]:
    """Of two (error, tolerance) pairs, the one with the larger error / tolerance (ties to ``candidate``)."""
    return candidate if candidate[0] / candidate[1] >= worst[0] / worst[1] else worst
