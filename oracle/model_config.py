"""The configurations of a whole Llama-family model, shared by the oracle, the suite and every model adapter.

As ``config.py`` is for one attention layer, these frozen dataclasses *are* the conventions of
docs/spec.md §15: whoever builds a model or a context from them (the reference, llama.cpp through
its adapter) must mean the same thing by each field. Matrices are stored ``(out, in)``, as GGUF
tensors read back in numpy: a projection is ``y[o] = sum_i W[o, i] * x[i]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .config import ROPE_STYLES, OracleInputError, RopeConfig, RopeStyle


def _is_count(value: object, least: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


Activation = Literal["silu", "gelu_tanh"]
ACTIVATIONS: tuple[Activation, ...] = ("silu", "gelu_tanh")  # the feed-forward's gate activation
# The architectures an engine may run the model as (llama.cpp's arch names): ``llama`` every switch off, ``gemma3``
# every switch on (embedding scale, q/k norms, post norms, gelu_tanh) with RoPE half_split (llama.cpp's NEOX).
ARCHITECTURES = ("llama", "gemma3")
GEMMA3_SWITCHES: dict[str, Any] = {"embedding_scale": True, "qk_norm": True, "post_norms": True,
                                   "activation": "gelu_tanh"}
WindowPattern = str | int | tuple[bool, ...]


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and conventions of a Llama-family decoder (llama.cpp's arch ``llama``).

    ``vocab`` V, ``model_width`` D, ``layers`` L, ``heads`` H, ``kv_heads`` KV (query head ``h`` reads kv head
    ``h // (H // KV)``), ``head_width`` dh (independent of D, as GGUF's ``attention.key_length``), ``ffn_width``
    F. RoPE rotates the whole head (``rope_style``: ``"interleaved"`` pairs features ``2i, 2i+1``, llama.cpp's
    ``llama``; ``"half_split"`` pairs ``i, i + dh/2``) with ``rope_base``; positions must lie in
    ``[0, max_positions)``. RMSNorm is ``x / sqrt(mean(x^2) + norm_eps) * w``. ``tied_output``: the logits
    are ``h @ embedding^T`` (no output matrix). ``window`` W: a query at position p sees the keys at
    positions ``p-W+1 .. p`` only (None: every earlier position), in the layers ``window_pattern`` windows:
    ``"all"`` (every layer), an int k >= 2 (layer i is global, unwindowed, iff ``(i+1) % k == 0``: Gemma 3's 6,
    Gemma 2's 2) or a tuple of one bool per layer (True: windowed). ``local_rope_base``: the RoPE base of the
    windowed layers (None: ``rope_base``; Gemma 3: 10000 local, 1e6 global).

    Gemma 3's switches, all off for a Llama model: ``embedding_scale`` (the embedding row times ``sqrt(D)``),
    ``qk_norm`` (each head's query and key RMSNormed with weights ``[dh]`` shared by the heads, before RoPE),
    ``post_norms`` (the attention output and the feed-forward output each RMSNormed before its residual add),
    ``activation`` (the gate's: ``"silu"``, or ``"gelu_tanh"``, GELU's tanh approximation). Norm weights multiply
    (GGUF's convention; transformers' Gemma stores ``w - 1`` and multiplies by ``1 + w``).
    """

    vocab: int = 16
    model_width: int = 8
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    head_width: int = 4
    ffn_width: int = 12
    rope_style: RopeStyle = "interleaved"
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    tied_output: bool = False
    window: int | None = None
    max_positions: int = 64
    window_pattern: WindowPattern = "all"
    local_rope_base: float | None = None
    embedding_scale: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    activation: Activation = "silu"

    def __post_init__(self) -> None:
        for name in ("vocab", "model_width", "layers", "heads", "kv_heads", "head_width", "ffn_width",
                     "max_positions"):
            if not _is_count(getattr(self, name)):
                raise OracleInputError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        if self.heads % self.kv_heads:
            raise OracleInputError(f"heads {self.heads} must be a multiple of kv heads {self.kv_heads}")
        if self.head_width % 2:
            raise OracleInputError(f"head width {self.head_width} must be even: RoPE rotates pairs")
        if self.rope_style not in ROPE_STYLES:
            raise OracleInputError(f"rope_style must be one of {ROPE_STYLES}, got {self.rope_style!r}")
        if not (isinstance(self.norm_eps, float) and math.isfinite(self.norm_eps) and self.norm_eps > 0.0):
            raise OracleInputError(f"norm_eps must be a finite positive float, got {self.norm_eps!r}")
        if not isinstance(self.tied_output, bool):
            raise OracleInputError(f"tied_output must be a bool, got {self.tied_output!r}")
        if self.window is not None and not _is_count(self.window):
            raise OracleInputError(f"window must be None or an int >= 1, got {self.window!r}")
        self._check_pattern()
        for name in ("embedding_scale", "qk_norm", "post_norms"):
            if not isinstance(getattr(self, name), bool):
                raise OracleInputError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.activation not in ACTIVATIONS:
            raise OracleInputError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        _ = self.rope  # building it validates the base
        if self.local_rope_base is not None:
            if self.window is None:
                raise OracleInputError("a local_rope_base without a window: no layer is windowed")
            _ = RopeConfig(self.rope_style, self.local_rope_base, self.head_width, self.max_positions)

    def _check_pattern(self) -> None:
        pattern = self.window_pattern
        if isinstance(pattern, str):
            if pattern != "all":
                raise OracleInputError(f"window_pattern must be 'all', an int >= 2 or a tuple of bools, got "
                                       f"{pattern!r}")
        elif isinstance(pattern, tuple):
            if len(pattern) != self.layers or not all(isinstance(b, bool) for b in pattern):
                raise OracleInputError(f"window_pattern as a tuple must hold one bool per layer ({self.layers}), "
                                       f"got {pattern!r}")
        elif not _is_count(pattern, 2):
            raise OracleInputError(f"window_pattern must be 'all', an int >= 2 or a tuple of bools, got {pattern!r}")
        if pattern != "all" and self.window is None:
            raise OracleInputError(f"a window_pattern {pattern!r} without a window")

    def layer_windowed(self, layer: int) -> bool:
        """Whether layer ``layer`` attends through the window (False without one)."""
        if not 0 <= layer < self.layers:
            raise OracleInputError(f"layer {layer} outside the model's {self.layers}")
        pattern = self.window_pattern
        if self.window is None:
            return False
        if pattern == "all":
            return True
        if isinstance(pattern, tuple):
            return pattern[layer]
        return (layer + 1) % int(pattern) != 0

    def layer_window(self, layer: int) -> int | None:
        """The window of layer ``layer``: ``window`` where the pattern windows it, else None (global)."""
        return self.window if self.layer_windowed(layer) else None

    def layer_rope(self, layer: int) -> RopeConfig:
        """The RoPE of layer ``layer``: ``local_rope_base`` in a windowed layer where one is given."""
        if self.local_rope_base is not None and self.layer_windowed(layer):
            return RopeConfig(self.rope_style, self.local_rope_base, self.head_width, self.max_positions)
        return self.rope

    @property
    def interleaved(self) -> bool:
        """Whether the layers may differ in window or RoPE base (the capability ``interleaved_windows``)."""
        return self.window_pattern != "all" or self.local_rope_base is not None

    @property
    def architecture(self) -> str | None:
        """The engine architecture this model is (``ARCHITECTURES``): ``llama`` with every Gemma switch off,
        ``gemma3`` with every one on and RoPE ``half_split``; None for another mix, which no engine runs."""
        switched = [getattr(self, name) == on for name, on in GEMMA3_SWITCHES.items()]
        if not any(switched):
            return "llama"
        if all(switched) and self.rope_style == "half_split":
            return "gemma3"
        return None

    @property
    def rope(self) -> RopeConfig:
        return RopeConfig(self.rope_style, self.rope_base, self.head_width, self.max_positions)

    @property
    def group_size(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads


OPTIONAL_LAYER_ARRAYS = ("q_norm", "k_norm", "post_attention_norm", "post_ffn_norm")


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """One transformer block, matrices ``(out, in)``.

    ``attention_norm [D]``; ``wq [H*dh, D]``, ``wk [KV*dh, D]``, ``wv [KV*dh, D]``, ``wo [D, H*dh]``;
    ``ffn_norm [D]``; ``w_gate [F, D]``, ``w_up [F, D]``, ``w_down [D, F]``. (GGUF names: ``attn_norm``,
    ``attn_q``, ``attn_k``, ``attn_v``, ``attn_output``, ``ffn_norm``, ``ffn_gate``, ``ffn_up``, ``ffn_down``.)
    With ``qk_norm``: ``q_norm``, ``k_norm [dh]`` (``attn_q_norm``, ``attn_k_norm``); with ``post_norms``:
    ``post_attention_norm``, ``post_ffn_norm [D]`` (``post_attention_norm``, ``post_ffw_norm``); None exactly
    when the switch is off.
    """

    attention_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    ffn_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attention_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None

    def shapes(self, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        """The shape of every array the configuration gives a layer (the optional ones only where switched on)."""
        d, f, dh = config.model_width, config.ffn_width, config.head_width
        shapes = {"attention_norm": (d,), "wq": (config.heads * dh, d), "wk": (config.kv_heads * dh, d),
                  "wv": (config.kv_heads * dh, d), "wo": (d, config.heads * dh), "ffn_norm": (d,),
                  "w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}
        if config.qk_norm:
            shapes |= {"q_norm": (dh,), "k_norm": (dh,)}
        if config.post_norms:
            shapes |= {"post_attention_norm": (d,), "post_ffn_norm": (d,)}
        return shapes


@dataclass(frozen=True, eq=False)
class ModelWeights:
    """Every parameter of a model: ``embedding [V, D]`` (GGUF ``token_embd``), the blocks, ``output_norm [D]``
    and ``output [V, D]`` (None exactly when the configuration ties the head to the embedding)."""

    embedding: np.ndarray
    layers: tuple[LayerWeights, ...]
    output_norm: np.ndarray
    output: np.ndarray | None

    def check(self, config: ModelConfig) -> None:
        """Raise ``OracleInputError`` naming the first array that does not fit ``config``."""
        expected: list[tuple[str, Any, tuple[int, ...]]] = [
            ("embedding", self.embedding, (config.vocab, config.model_width)),
            ("output_norm", self.output_norm, (config.model_width,))]
        if (self.output is None) != config.tied_output:
            raise OracleInputError("output must be None exactly when tied_output is declared")
        if self.output is not None:
            expected.append(("output", self.output, (config.vocab, config.model_width)))
        if len(self.layers) != config.layers:
            raise OracleInputError(f"{len(self.layers)} layers of weights for a model of {config.layers}")
        for index, layer in enumerate(self.layers):
            shapes = layer.shapes(config)
            for name in OPTIONAL_LAYER_ARRAYS:
                if (getattr(layer, name) is None) == (name in shapes):
                    raise OracleInputError(f"layers[{index}].{name} must be None exactly when its switch "
                                           f"({'qk_norm' if name in ('q_norm', 'k_norm') else 'post_norms'}) is off")
            expected += [(f"layers[{index}].{name}", getattr(layer, name), shape) for name, shape in shapes.items()]
        for name, array, shape in expected:
            if not isinstance(array, np.ndarray) or array.dtype != np.float64 or array.shape != shape:
                raise OracleInputError(f"{name} must be a float64 array of shape {shape}")
            if not np.all(np.isfinite(array)):
                raise OracleInputError(f"{name} must be finite")


def random_model_weights(config: ModelConfig, seed: int) -> ModelWeights:
    """Untrained weights from ``seed``: embedding ~ N(0, 1), norms ~ 1 + U(-0.25, 0.25), matrices ~ N(0, 1/in)."""
    rng = np.random.default_rng(seed)
    d, f = config.model_width, config.ffn_width

    def matrix(out: int, inner: int) -> np.ndarray:
        return rng.normal(0.0, 1.0 / math.sqrt(inner), (out, inner))

    def norm(width: int = d) -> np.ndarray:
        return 1.0 + rng.uniform(-0.25, 0.25, width)

    q_width, kv_width = config.heads * config.head_width, config.kv_heads * config.head_width

    def layer() -> LayerWeights:  # drawn in this order; the switched-on norms only (a Llama's draws unchanged)
        arrays: dict[str, np.ndarray | None] = {
            "attention_norm": norm(), "wq": matrix(q_width, d), "wk": matrix(kv_width, d), "wv": matrix(kv_width, d)}
        if config.qk_norm:
            arrays |= {"q_norm": norm(config.head_width), "k_norm": norm(config.head_width)}
        arrays |= {"wo": matrix(d, q_width)}
        if config.post_norms:
            arrays |= {"post_attention_norm": norm()}
        arrays |= {"ffn_norm": norm(), "w_gate": matrix(f, d), "w_up": matrix(f, d), "w_down": matrix(d, f)}
        if config.post_norms:
            arrays |= {"post_ffn_norm": norm()}
        return LayerWeights(**arrays)  # type: ignore[arg-type]

    layers = tuple(layer() for _ in range(config.layers))
    embedding = rng.normal(0.0, 1.0, (config.vocab, d))
    output_norm = norm()
    output = None if config.tied_output else matrix(config.vocab, d)
    return ModelWeights(embedding=embedding, layers=layers, output_norm=output_norm, output=output)


MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),  # V 16, D 8, 2 layers, 2 heads over 1 kv head (MQA), dh 4, F 12, interleaved
    "tiny-mha": ModelConfig(kv_heads=2),
    "tiny-half-split": ModelConfig(rope_style="half_split", heads=4, kv_heads=2),
    "tiny-tied": ModelConfig(tied_output=True),
    "tiny-window3": ModelConfig(window=3),
}


def gemma3_config(**fields: Any) -> ModelConfig:
    """A Gemma-3-style model (llama.cpp's arch ``gemma3``): every switch on, RoPE half_split, a window of 3 in every
    layer but each second (``window_pattern`` 2) with a local RoPE base of 10000 and a global one of 1e6; tied
    output, as Gemma's. ``fields`` override any of these (and the tiny shapes)."""
    gemma = {"rope_style": "half_split", "rope_base": 1e6, "local_rope_base": 10000.0, "window": 3,
             "window_pattern": 2, **GEMMA3_SWITCHES, "tied_output": True, "norm_eps": 1e-6}
    return ModelConfig(**{**gemma, **fields})


MODEL_PRESETS |= {
    "tiny-interleaved": ModelConfig(window=2, window_pattern=2, local_rope_base=100.0),
    "tiny-gemma3": gemma3_config(),
}


@dataclass(frozen=True)
class ContextConfig:
    """A context (llama.cpp's ``llama_context``) asked for: ``cells`` (``n_ctx``), ``max_sequences``
    (``n_seq_max``: sequence ids are ``0 .. max_sequences-1``) and ``unified`` (``kv_unified``: one store of
    cells shared by every sequence; otherwise one store per sequence, each of ``cells // max_sequences``)."""

    cells: int = 16
    max_sequences: int = 2
    unified: bool = True
    # kept sink tokens S (StreamingLLM): in a windowed model a token also sees its sequence's cells at positions < S,
    # and a store that evicts never evicts them (docs/spec.md §15.2); 0: none
    sinks: int = 0

    def __post_init__(self) -> None:
        if not (_is_count(self.cells) and _is_count(self.max_sequences)) or not isinstance(self.unified, bool):
            raise OracleInputError(f"a context needs ints cells, max_sequences >= 1 and a bool unified; got {self}")
        if not _is_count(self.sinks, 0):
            raise OracleInputError(f"sinks must be an int >= 0, got {self.sinks!r}")
        if not self.unified and self.cells < self.max_sequences:
            raise OracleInputError(f"{self.cells} cells cannot give each of {self.max_sequences} sequences one")

    @property
    def stream_cells(self) -> int:
        """The cells of one store: all of them when unified, else each sequence's share."""
        return self.cells if self.unified else self.cells // self.max_sequences


@dataclass(frozen=True)
class ModelBatch:
    """One ``decode_batch`` call (llama.cpp's ``llama_batch``): token ``i`` is ``tokens[i]`` at ``positions[i]`` in
    sequence ``sequences[i]``; ``logits[i]``: whether its logits are returned (rows in batch order).

    ``sequences[i]`` is one sequence id, or -- only for an adapter declaring ``multi_sequence_tokens`` -- a tuple of
    several: the token is one cell that every one of them holds (llama.cpp's ``n_seq_id > 1``, a prompt shared by
    several sequences decoded once). ``sequences_of(i)`` reads either as a tuple.

    The contents are kept exactly as the suite built them, valid or not (a malformed batch is a test
    input); only the lengths must agree. An id or position is an int when it is a Python int or a numpy
    integer scalar (``np.int64``, ``np.int32``: what sampling from a logits array gives), never a bool
    (docs/spec.md §15.3).
    """

    tokens: tuple[Any, ...]
    positions: tuple[Any, ...]
    sequences: tuple[Any, ...]
    logits: tuple[bool, ...]

    def __post_init__(self) -> None:
        lengths = {len(self.tokens), len(self.positions), len(self.sequences), len(self.logits)}
        if len(lengths) != 1:
            raise OracleInputError(f"a batch's tokens, positions, sequences and logits differ in length: {lengths}")

    @classmethod
    def of_sequence(cls, sequence: int, tokens: tuple[int, ...] | list[int], start: int, *,
                    all_logits: bool = True) -> ModelBatch:
        """``tokens`` of one sequence at ``start, start+1, ...``; logits of every token, or of the last only."""
        count = len(tokens)
        return cls(tuple(tokens), tuple(range(start, start + count)), (sequence,) * count,
                   tuple(all_logits or i == count - 1 for i in range(count)))

    @classmethod
    def shared(cls, sequences: tuple[int, ...], tokens: tuple[int, ...] | list[int], start: int) -> ModelBatch:
        """``tokens`` each held by every one of ``sequences`` at ``start, start+1, ...``; every token's logits."""
        count = len(tokens)
        return cls(tuple(tokens), tuple(range(start, start + count)), (tuple(sequences),) * count, (True,) * count)

    def sequences_of(self, index: int) -> tuple[Any, ...]:
        """The sequences token ``index`` belongs to: its one id, or the ids of its tuple."""
        entry = self.sequences[index]
        return tuple(entry) if isinstance(entry, tuple) else (entry,)

    @property
    def several_sequences(self) -> bool:
        """Whether a token names several sequences (a tuple of ids)."""
        return any(isinstance(entry, tuple) for entry in self.sequences)

    @property
    def wanted(self) -> int:
        return sum(bool(w) for w in self.logits)
