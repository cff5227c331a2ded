"""Parameters with a lifelong identity and a value version, and an in-place AdamW.

A cache records *which* parameter objects its rows came from and *at which
version*. Identity is the object itself; the version counts every write of
its values. Readers get a read-only view, so the only way to change values is
through ``assign`` or ``update``, which bump the version.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .errors import InvalidLayerConfig


class Parameter:
    """One float64 tensor whose values change only in place, with a version."""

    __slots__ = ("_data", "_version", "name")

    def __init__(self, name: str, values: np.ndarray) -> None:
        if not isinstance(values, np.ndarray) or values.dtype != np.float64:
            raise InvalidLayerConfig(f"parameter {name} must be a float64 numpy array")
        if not np.isfinite(values).all():
            raise InvalidLayerConfig(f"parameter {name} has non-finite values")
        self.name = name
        self._data = np.array(values, dtype=np.float64, order="C")  # owned copy
        self._version = 0

    @property
    def value(self) -> np.ndarray:
        """A read-only view of the current values."""
        view: np.ndarray = self._data.view()
        view.flags.writeable = False
        return view

    @property
    def version(self) -> int:
        return self._version

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    def assign(self, values: np.ndarray) -> None:
        """Overwrite the values in place (same object, same memory); bumps the version."""
        values = np.asarray(values)
        if values.shape != self._data.shape or not np.issubdtype(values.dtype, np.floating):
            raise InvalidLayerConfig(f"parameter {self.name} needs float values of shape {self.shape}")
        if not np.isfinite(values).all():
            raise InvalidLayerConfig(f"parameter {self.name} cannot take non-finite values")
        self._data[...] = values
        self._version += 1

    def update(self, step: Callable[[np.ndarray], None]) -> None:
        """Let ``step`` write into the buffer in place; bumps the version."""
        step(self._data)
        self._version += 1


class AdamW:
    """Decoupled-weight-decay Adam (Loshchilov & Hutter) writing parameters in place."""

    def __init__(self, parameters: list[Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        self.parameters = list(parameters)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self._m = [np.zeros(p.shape) for p in self.parameters]
        self._v = [np.zeros(p.shape) for p in self.parameters]
        self._t = 0

    def step(self, gradients: list[np.ndarray]) -> None:
        if len(gradients) != len(self.parameters):
            raise InvalidLayerConfig(f"AdamW needs {len(self.parameters)} gradients, got {len(gradients)}")
        for parameter, gradient in zip(self.parameters, gradients):
            if np.shape(gradient) != parameter.shape:
                raise InvalidLayerConfig(f"gradient for {parameter.name} must have shape {parameter.shape}")
        self._t += 1
        beta1, beta2 = self.betas
        for parameter, gradient, m, v in zip(self.parameters, gradients, self._m, self._v):
            m *= beta1
            m += (1 - beta1) * gradient
            v *= beta2
            v += (1 - beta2) * np.square(gradient)
            m_hat = m / (1 - beta1 ** self._t)
            v_hat = v / (1 - beta2 ** self._t)

            def write(data: np.ndarray, m_hat: np.ndarray = m_hat, v_hat: np.ndarray = v_hat) -> None:
                data *= 1 - self.lr * self.weight_decay
                data -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)

            parameter.update(write)
