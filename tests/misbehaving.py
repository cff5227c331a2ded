"""Adapters that misbehave on purpose, each in one way, around the reference implementation.

Each misbehaves only once its cache holds a row, so Hypothesis can shrink to
a two-step program, and so the verdict must name a step, not set-up
(``AlwaysReturnsTheWrongDtype`` aside: a cause met in every example).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import time
from typing import Any

import numpy as np

from impl.conformance import ReferenceAdapter


class _Misbehaving(ReferenceAdapter):
    def _holds_rows(self, cache: Any) -> bool:
        return int(cache.length) >= 1


class MutatesItsInput(_Misbehaving):
    name = "misbehaving-mutates-input"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        output = super().step(layer, cache, x)
        if self._holds_rows(cache) and x.flags.writeable:
            x *= 2.0  # writes into the caller's array (where it can: a read-only row would raise)
        return output


class ReturnsTheWrongShape(_Misbehaving):
    name = "misbehaving-wrong-shape"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        busy = self._holds_rows(cache)
        output = super().step(layer, cache, x)
        return output[:, 0, :] if busy else output  # [B, D] instead of [B, 1, D]


class ReturnsTheWrongDtype(_Misbehaving):
    name = "misbehaving-wrong-dtype"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        busy = self._holds_rows(cache)
        output = super().step(layer, cache, x)
        return output.astype(np.float32) if busy else output


class AlwaysReturnsTheWrongDtype(ReturnsTheWrongDtype):
    """Fails every example with a step, the first step on an empty cache too: a cause met at once, every time."""

    name = "misbehaving-wrong-dtype-always"

    def _holds_rows(self, cache: Any) -> bool:
        return True


class RaisesAnUnmappedError(_Misbehaving):
    name = "misbehaving-unmapped-error"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        if self._holds_rows(cache):
            raise RuntimeError("internal error in the implementation")
        return super().step(layer, cache, x)


class ErrorKindRaises(RaisesAnUnmappedError):
    name = "misbehaving-error-kind-raises"

    def error_kind(self, error: BaseException) -> str | None:
        return {"CacheFull": "full"}[type(error).__name__]  # KeyError for anything else


class Hangs(_Misbehaving):
    name = "misbehaving-hangs"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        if self._holds_rows(cache):
            time.sleep(3600)
        return super().step(layer, cache, x)


class ReturnsAList(_Misbehaving):
    name = "misbehaving-returns-a-list"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> Any:
        busy = self._holds_rows(cache)
        output = super().step(layer, cache, x)
        return output.tolist() if busy else output


class ResetKeepsTheLength(_Misbehaving):
    """Fails the layer machine's ``reset`` rule only (decode sessions reset through ``reset_session``)."""

    name = "misbehaving-reset-keeps-length"

    def reset(self, cache: Any) -> None:
        if not self._holds_rows(cache):
            super().reset(cache)


# -- engines that kill their process: run them only under protocol.isolation.isolated (tests/test_isolation.py) --

class Aborts(_Misbehaving):
    """A C assertion's way out: SIGABRT, with a message on stderr first."""

    name = "misbehaving-aborts"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        if self._holds_rows(cache):
            os.write(2, b"cache.c:42: GGML_ASSERT(n_rows < capacity) failed\n")
            os.abort()
        return super().step(layer, cache, x)


class Segfaults(_Misbehaving):
    name = "misbehaving-segfaults"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        if self._holds_rows(cache):
            faulthandler.disable()  # the crash itself, not Python's report of it
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        return super().step(layer, cache, x)


class ExitsOnTheThirdStep(ReferenceAdapter):
    """Dies by ``exit(3)`` (no signal) on its third ``step`` call, whatever the cache holds."""

    name = "misbehaving-exits"
    steps = 0

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        self.steps += 1
        if self.steps == 3:
            os._exit(3)
        return super().step(layer, cache, x)
