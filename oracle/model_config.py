"""The configurations of a whole Llama-family model, shared by the oracle, the suite and every model adapter.

As ``config.py`` is for one attention layer, these frozen dataclasses *are* the conventions of
docs/spec.md §15: whoever builds a model or a context from them (the reference, llama.cpp through
its adapter) must mean the same thing by each field. Matrices are stored ``(out, in)``, as GGUF
tensors read back in numpy: a projection is ``y[o] = sum_i W[o, i] * x[i]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import ROPE_STYLES, OracleInputError, RopeConfig, RopeStyle


def _is_count(value: object, least: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and conventions of a Llama-family decoder (llama.cpp's arch ``llama``).

    ``vocab`` V, ``model_width`` D, ``layers`` L, ``heads`` H, ``kv_heads`` KV (query head ``h`` reads kv head
    ``h // (H // KV)``), ``head_width`` dh (independent of D, as GGUF's ``attention.key_length``), ``ffn_width``
    F. RoPE rotates the whole head (``rope_style``: ``"interleaved"`` pairs features ``2i, 2i+1``, llama.cpp's
    ``llama``; ``"half_split"`` pairs ``i, i + dh/2``) with ``rope_base``; positions must lie in
    ``[0, max_positions)``. RMSNorm is ``x / sqrt(mean(x^2) + norm_eps) * w``. ``tied_output``: the logits
    are ``h @ embedding^T`` (no output matrix). ``window`` W: a query at position p sees the keys at
    positions ``p-W+1 .. p`` only (None: every earlier position).
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
        _ = self.rope  # building it validates the base

    @property
    def rope(self) -> RopeConfig:
        return RopeConfig(self.rope_style, self.rope_base, self.head_width, self.max_positions)

    @property
    def group_size(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """One transformer block, matrices ``(out, in)``.

    ``attention_norm [D]``; ``wq [H*dh, D]``, ``wk [KV*dh, D]``, ``wv [KV*dh, D]``, ``wo [D, H*dh]``;
    ``ffn_norm [D]``; ``w_gate [F, D]``, ``w_up [F, D]``, ``w_down [D, F]``. (GGUF names: ``attn_norm``,
    ``attn_q``, ``attn_k``, ``attn_v``, ``attn_output``, ``ffn_norm``, ``ffn_gate``, ``ffn_up``, ``ffn_down``.)
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

    def shapes(self, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        d, f, dh = config.model_width, config.ffn_width, config.head_width
        return {"attention_norm": (d,), "wq": (config.heads * dh, d), "wk": (config.kv_heads * dh, d),
                "wv": (config.kv_heads * dh, d), "wo": (d, config.heads * dh), "ffn_norm": (d,),
                "w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}


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
            expected += [(f"layers[{index}].{name}", getattr(layer, name), shape)
                         for name, shape in layer.shapes(config).items()]
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

    def norm() -> np.ndarray:
        return 1.0 + rng.uniform(-0.25, 0.25, d)

    q_width, kv_width = config.heads * config.head_width, config.kv_heads * config.head_width
    layers = tuple(LayerWeights(attention_norm=norm(), wq=matrix(q_width, d), wk=matrix(kv_width, d),
                                wv=matrix(kv_width, d), wo=matrix(d, q_width), ffn_norm=norm(),
                                w_gate=matrix(f, d), w_up=matrix(f, d), w_down=matrix(d, f))
                   for _ in range(config.layers))
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
