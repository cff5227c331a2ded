"""Traces as files: values <-> JSON, exactly, and the trace format.

A trace holds no pickles and names no module: values are JSON, arrays are
``{"$array": {dtype, shape, data}}`` with floats written exactly (``repr``
round-trips) and non-finite ones as strings, plus their memory layout where
it is not plain C order; the suite's own dataclasses are tagged by name.

Format versions: 1, values only; 2, arrays record their layout (and object
arrays); 3, every expectation in the call policy's one vocabulary
(``judge.policy.Expect``); 4, the declarations besides capabilities its draws relied on (``declarations``:
name -> the value and the rules that relied on it, ``generate.needs.DECLARATIONS``); 5, what the later steps relied
on of the adapter's claims (``claims``: capability -> claimed, and the steps: a rejection under it, an acceptance
without it), what became of each call not claimed (an expectation's ``outcome``: raised or replaced), and what
the adapter showed that the draws depend on (a step's ``observed``: a context's cells). All five are read (of
1-4, the claims rejections relied on are read from their steps).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..generate.arguments import Argument
from ..generate.inputs import MalformedRow
from ..generate.layers import LayerConfig
from ..generate.layouts import layout_of, with_layout
from ..oracle import (
    AttentionWeights,
    ContextConfig,
    DecoderConfig,
    DecoderWeights,
    LayerWeights,
    ModelBatch,
    ModelConfig,
    ModelWeights,
    RopeConfig,
)

FORMAT = "kvcache-conformance-trace"
FORMAT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
_DATACLASSES = {cls.__name__: cls for cls in (AttentionWeights, Argument, DecoderConfig, DecoderWeights,
                                              LayerConfig, MalformedRow, RopeConfig,
                                              ModelConfig, ContextConfig, ModelBatch, ModelWeights, LayerWeights)}


class TraceError(ValueError):
    """A trace file is malformed, of another format version, or names something unknown."""


# -- values <-> JSON ------------------------------------------------------------------------------------

def _number(value: float) -> float | str:
    return value if math.isfinite(value) else repr(float(value))  # 'nan', 'inf', '-inf'


def encode(value: Any) -> Any:
    """A JSON-able description of ``value`` from which ``decode`` rebuilds an equal value."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, np.ndarray):
        flat = value.ravel().tolist()  # logical (C) order, whatever the layout
        if value.dtype.kind == "c":
            data: list[Any] = [[_number(z.real), _number(z.imag)] for z in flat]
        elif value.dtype.kind == "f":
            data = [_number(v) for v in flat]
        elif value.dtype.kind == "O":
            data = [encode(v) for v in flat]
        else:
            data = flat
        body = {"dtype": value.dtype.str, "shape": list(value.shape), "data": data}
        order, writeable = layout_of(value)
        if (order, writeable) != ("C", True):  # how the adapter was handed it: part of the input
            body["layout"] = {"order": order, "writeable": writeable}
        return {"$array": body}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [encode(v) for v in value]}
    if is_dataclass(value) and type(value).__name__ in _DATACLASSES:
        return {"$" + type(value).__name__: {f.name: encode(getattr(value, f.name)) for f in fields(value)
                                             if f.init}}
    raise TypeError(f"a trace cannot hold a {type(value).__name__}: {value!r}")


def _float(text: Any) -> float:
    if isinstance(text, str):
        if text not in ("nan", "inf", "-inf"):
            raise TraceError(f"not a number: {text!r}")
        return float(text)
    return float(text)


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise TraceError(f"expected one tagged value, got keys {sorted(value)}")
    ((tag, body),) = value.items()
    if tag == "$float":
        return _float(body)
    if tag == "$tuple":
        return tuple(decode(v) for v in body)
    if tag == "$array":
        dtype = np.dtype(body["dtype"])
        if dtype.kind == "c":
            data: list[Any] = [complex(_float(re), _float(im)) for re, im in body["data"]]
        elif dtype.kind == "f":
            data = [_float(v) for v in body["data"]]
        elif dtype.kind == "O":
            data = [decode(v) for v in body["data"]]
        else:
            data = body["data"]
        array = np.empty(len(data), dtype=dtype)
        array[:] = data
        array = array.reshape(body["shape"])
        layout = body.get("layout")
        if layout is None:
            return array
        try:
            return with_layout(array, layout["order"], bool(layout["writeable"]))
        except (ValueError, KeyError, TypeError) as error:
            raise TraceError(f"bad array layout {layout!r}: {error}") from error
    cls = _DATACLASSES.get(tag[1:]) if tag.startswith("$") else None
    if cls is None:
        raise TraceError(f"unknown tag {tag!r}")
    return cls(**{name: decode(v) for name, v in body.items()})


# -- files ------------------------------------------------------------------------------------------------

def write(trace: dict[str, Any], directory: Path, stem: str) -> Path:
    """Write ``trace`` as ``directory/stem-<digest>.json`` (equal traces share a file); return the path."""
    text = json.dumps(trace, indent=1, allow_nan=False) + "\n"
    digest = hashlib.sha256(json.dumps(trace["steps"], allow_nan=False).encode()).hexdigest()[:10]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}-{digest}.json"
    path.write_text(text)
    return path


def load(path: Path) -> dict[str, Any]:
    try:
        trace = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise TraceError(f"{path}: cannot read a trace: {error}") from error
    if not isinstance(trace, dict) or trace.get("format") != FORMAT:
        raise TraceError(f"{path}: not a {FORMAT} file")
    if trace.get("format_version") not in READABLE_VERSIONS:
        raise TraceError(f"{path}: format version {trace.get('format_version')}, this suite reads "
                         f"{', '.join(map(str, READABLE_VERSIONS))}")
    return trace
