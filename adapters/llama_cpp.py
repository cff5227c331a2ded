"""llama.cpp as a whole-model adapter (docs/spec.md §15): llama-cpp-python 0.3.36's low-level bindings.

The suite's weights are written as a GGUF file (``adapters.llama_gguf``) and loaded; every sequence operation
is the ``llama_memory_*`` / ``llama_state_seq_*`` call of the same name in llama.h, on ``llama_get_memory``.
Where llama.cpp reports by return value the adapter raises (docs/spec.md §15.5): ``llama_decode`` 1 is
``full``, -1 ``malformed_batch``; ``llama_memory_seq_rm`` false is ``refused``; ``llama_state_seq_set_data``
0 is ``full``. Nothing is checked here that the engine checks itself: the adapter only refuses what
cannot cross ctypes (a token, position or sequence that is not an int of int32 range). An argument the engine
asserts on (``GGML_ASSERT``: an unknown sequence id in a memory call, a range copy between per-sequence stores)
aborts the process: run it isolated (``make_isolated_adapter``, protocol/isolation.py) to see that as a crash.

One adapter is one configuration (``LlamaCppConfig``): the KV cache's element type (``type_k`` = ``type_v``:
f32, f16, q8_0, q4_0), flash attention on or off, the context kinds asked for (``kv_unified`` true, false, or
both), and the micro-batch (``n_ubatch``: by default ``n_batch``, so a batch is one ubatch; configured small,
``make_micro_batch_adapter``, the suite's batches of up to 8 tokens are split, and ``model_limits`` declares it).
Computation is float32 on the CPU, one thread. The factories at the end are the configurations measured in
docs/llama-cpp/NOTES.md (the micro-batch one is not measured yet).

With ``windows`` a configuration also takes windowed models (issue 37): a model with Gemma 3's switches is written
as arch gemma3 and runs over llama.cpp's two stores (``llama_kv_cache_iswa``), ``swa_full`` on (llama.cpp's
default) or off; ``make_windows_*`` are those measured in docs/llama-cpp/windows.md, declared by ``WINDOW_*``
(docs/spec.md §15.1, §15.2, §15.6, §15.7); verdicts in docs/llama-cpp/README.md.

Requires the ``llamacpp`` extra (``pip install -e '.[llamacpp]'``: it builds llama-cpp-python from source,
about 25-45 minutes on two cores).
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from adapters.llama_gguf import UnsupportedModel, write_gguf
from kvcache_conformance.protocol.isolation import Isolated, isolated
from kvcache_conformance.protocol.model import ContextConfig, ModelBatch, ModelConfig, ModelWeights

LLAMA_CPP_PYTHON = "0.3.36"
CACHE_TYPES = ("f32", "f16", "q8_0", "q4_0")
KV_STORAGE_OF = {"f32": "float32", "f16": "float16", "q8_0": "q8_0", "q4_0": "q4_0"}  # docs/spec.md §15.6
MAX_BATCH = 512  # n_batch, and n_ubatch unless configured smaller (micro_batch): a batch is then one ubatch
INT32 = (-(2**31), 2**31 - 1)

# -- windowed models (issue 37; docs/spec.md §15.1, §15.2, §15.6): measured in docs/llama-cpp/windows.md.
WINDOW_CAPABILITIES = frozenset({"sliding_window", "interleaved_windows"})
# llama.cpp runs a window only in arch gemma3 (every Gemma-3 switch on): its arch llama has none, and the suite
# cannot be told "windows in gemma3 only", so the windowed configurations run gemma3 models alone (a model without
# a window is written with sliding_window 0: one plain store); the Llama ones are judged without --windows.
WINDOW_LIMITS: dict[str, Any] = {"architectures": ("gemma3",)}
WINDOW_POLICY: dict[str, Any] = {
    # the windowed layers' store keeps what the window can see, not every cell: a saved sequence keeps only its
    # last W positions there (whatever swa_full), and a full store (256 cells and more, swa_full off) reuses the
    # oldest cells no later token sees; seq_pos_min reports the windowed store's minimum
    "window_cells": "visible",
    # a removal is never refused (llama_memory_seq_rm returns true for any range of an attention cache)
    "window_removal": "any",
}
WINDOW_ACTIVATION_TABLE = "float16"  # the GELU's table (ggml-cpu's GGML_GELU_FP16), docs/spec.md §15.6


class LlamaCppError(Exception):
    """Something llama.cpp reported; ``last_log`` is what it logged last (llama.cpp's own words)."""

    def __init__(self, message: str, last_log: str = "") -> None:
        super().__init__(f"{message}{f' -- llama.cpp: {last_log}' if last_log else ''}")
        self.last_log = last_log


class ContextFull(LlamaCppError):
    """No room: ``llama_decode`` returned 1, or ``llama_state_seq_set_data`` 0."""


class MalformedBatch(LlamaCppError):
    """``llama_decode`` returned -1 (invalid input batch), or a value that cannot cross ctypes."""


class OperationRefused(LlamaCppError):
    """``llama_memory_seq_rm`` returned false, or an argument that cannot cross ctypes."""


class EngineFailure(LlamaCppError):
    """Anything else llama.cpp failed at (a model that does not load, a fatal decode): not an error kind."""


ERROR_KINDS = {ContextFull: "full", MalformedBatch: "malformed_batch", OperationRefused: "refused"}


# -- the library, loaded once --------------------------------------------------------------------------------------

class _Library:
    """llama_cpp imported, its backend initialised, its log kept (the last lines) instead of printed."""

    _lock = threading.Lock()
    _bindings: Any = None
    log: ClassVar[deque[str]] = deque(maxlen=20)

    @classmethod
    def get(cls) -> Any:
        with cls._lock:
            if cls._bindings is None:
                import llama_cpp  # the llamacpp extra

                if llama_cpp.__version__ != LLAMA_CPP_PYTHON:
                    raise ImportError(f"adapters/llama_cpp.py drives llama-cpp-python {LLAMA_CPP_PYTHON}, found "
                                      f"{llama_cpp.__version__} (pip install -e '.[llamacpp]')")
                llama_cpp.llama_backend_init()
                cls._callback = llama_cpp.llama_log_callback(cls._keep)  # referenced here: C holds it
                llama_cpp.llama_log_set(cls._callback, ctypes.c_void_p(0))
                cls._bindings = llama_cpp
            return cls._bindings

    @classmethod
    def _keep(cls, level: int, text: bytes | None, user_data: Any) -> None:
        line = (text or b"").decode(errors="replace").strip()
        if line and os.environ.get("KVCACHE_LLAMA_LOG"):
            os.write(2, f"llama.cpp: {line}\n".encode())
        if line and level >= 3:  # GGML_LOG_LEVEL_WARN and above: what explains a failure
            cls.log.append(line)

    @classmethod
    def last(cls) -> str:
        return cls.log[-1] if cls.log else ""


@dataclass(frozen=True)
class LlamaCppConfig:
    """What one adapter runs: the cache type (K and V alike), flash attention, the contexts asked for."""

    cache_type: str = "f32"
    flash_attn: bool = False
    contexts: tuple[str, ...] = ("unified", "per_sequence")
    # llama.cpp multiplies each head's rows by a Walsh-Hadamard matrix before a quantized cache stores them when
    # the head width is a multiple of 64; False sets LLAMA_ATTN_ROT_DISABLE=1 (read when a context is made).
    rotation: bool = True
    # n_ubatch: the tokens llama_decode computes at once, splitting a longer batch (None: n_batch, no split). At
    # most 4 (the suite's batches hold at most 8 tokens; model_limits micro_batch, docs/spec.md §15.7).
    micro_batch: int | None = None
    # Windowed models (issue 37): written as arch gemma3 (adapters/llama_gguf.py), run over llama.cpp's two stores
    # (llama_kv_cache_iswa: the global layers' and the windowed layers'), declared as docs/llama-cpp/windows.md says.

    windows: bool = False
    # swa_full: the windowed layers' store as large as the global one (llama.cpp's default, True); False: padded
    # to 256 cells at least, so that at the suite's sizes (contexts of 16 cells asked, 256 given) it is as large.
    swa_full: bool = True

    def __post_init__(self) -> None:
        if self.cache_type not in CACHE_TYPES:
            raise ValueError(f"cache_type must be one of {CACHE_TYPES}, got {self.cache_type!r}")
        if self.cache_type in ("q8_0", "q4_0") and not self.flash_attn:
            raise ValueError("a quantized V cache needs flash attention in llama.cpp: flash_attn=True")
        if not self.contexts or not set(self.contexts) <= {"unified", "per_sequence"}:
            raise ValueError(f"contexts must be drawn from 'unified', 'per_sequence', got {self.contexts!r}")
        if self.micro_batch is not None and not 1 <= self.micro_batch <= 4:
            raise ValueError(f"micro_batch must be None or 1-4, got {self.micro_batch!r}")
        if not self.swa_full and not self.windows:
            raise ValueError("swa_full=False is a setting of windowed models' stores: windows=True")


class LlamaModel:
    """A loaded model: its GGUF file (kept for the model's life) and llama.cpp's pointer."""

    def __init__(self, config: ModelConfig, weights: ModelWeights) -> None:
        lib = _Library.get()
        self.config = config
        self.directory = tempfile.TemporaryDirectory(prefix="kvcache-gguf-")
        path = write_gguf(Path(self.directory.name) / "model.gguf", config, weights)
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        self.pointer = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.pointer:
            raise EngineFailure("llama_model_load_from_file failed", _Library.last())
        self.vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.pointer))
        weakref.finalize(self, lib.llama_model_free, self.pointer)


class LlamaContext:
    """A context and its memory; holds its model so that the model outlives it."""

    def __init__(self, model: LlamaModel, config: ContextConfig, engine: LlamaCppConfig) -> None:
        lib = _Library.get()
        self.model, self.config = model, config
        params = lib.llama_context_default_params()
        params.n_ctx = config.cells
        params.n_batch = MAX_BATCH
        params.n_ubatch = engine.micro_batch or MAX_BATCH
        params.n_seq_max = config.max_sequences
        params.n_threads = params.n_threads_batch = 1
        params.kv_unified = config.unified
        params.swa_full = engine.swa_full  # read only for windowed models (two stores)
        params.type_k = params.type_v = getattr(lib, f"GGML_TYPE_{engine.cache_type.upper()}")
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if engine.flash_attn
                                  else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        params.embeddings = False
        params.no_perf = True
        self.pointer = lib.llama_init_from_model(model.pointer, params)
        if not self.pointer:
            raise EngineFailure(f"llama_init_from_model failed for {config}", _Library.last())
        self.memory = lib.llama_get_memory(self.pointer)
        weakref.finalize(self, lib.llama_free, self.pointer)


def _int32(value: Any, what: str, error: type[LlamaCppError]) -> int:
    """``value`` as a C int32, or ``error``: what ctypes cannot carry never reaches the engine."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise error(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if not INT32[0] <= int(value) <= INT32[1]:
        raise error(f"{what} {value} does not fit a C int32")
    return int(value)


class LlamaCppAdapter:
    """The model protocol (properties/protocol/model.py) over llama-cpp-python's low-level bindings."""

    name = "llama-cpp-python"
    version = LLAMA_CPP_PYTHON
    dtype = "float32"
    capabilities = frozenset({"whole_model", "gqa", "rope_interleaved", "rope_half_split", "fixed_capacity",
                              "seq_remove", "seq_copy", "seq_keep", "seq_shift", "seq_divide", "seq_state",
                              "validates_model_batch", "multi_sequence_tokens"})
    # Head widths: even (RoPE), 4 at least; quantized caches store blocks of 32 along a row.
    model_limits: ClassVar[dict[str, int]] = {"min_head_width": 4, "max_batch": MAX_BATCH, "min_vocab": 3}

    def __init__(self, engine: LlamaCppConfig | None = None) -> None:
        self.engine = engine or LlamaCppConfig()
        self.name = (f"llama-cpp-python[{self.engine.cache_type}{',flash' if self.engine.flash_attn else ''}"
                     f"{'' if len(self.engine.contexts) == 2 else ',' + self.engine.contexts[0]}]")
        self.kv_storage = KV_STORAGE_OF[self.engine.cache_type]
        if self.engine.flash_attn and self.kv_storage == "float32":  # its CPU kernel reads K and V as f16
            self.kv_storage = "float16"
        self.model_policy = {"contexts": list(self.engine.contexts), "shared_copies": True,
                             "copy_unified": "merge", "copy_per_sequence": "whole_only",
                             "negative_shift": "removed"}
        if self.engine.cache_type in ("q8_0", "q4_0"):
            # Blocks of 32 along a row; with the rotation on, head widths below 64, where it does not apply
            # (spec §15.6 judges the block formats of unrotated rows).
            self.model_limits = {**self.model_limits, "head_width_multiple": 32,
                                 **({"max_head_width": 32} if self.engine.rotation else {})}
            self.name = self.name[:-1] + ("" if self.engine.rotation else ",no rotation") + "]"
        if self.engine.micro_batch is not None:  # the suite draws batches longer than it (docs/spec.md §15.7)
            self.model_limits = {**self.model_limits, "micro_batch": self.engine.micro_batch}
            self.name = self.name[:-1] + f",ubatch {self.engine.micro_batch}]"
        if not self.engine.rotation:
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
        if self.engine.windows:
            self._declare_windows()

    def _declare_windows(self) -> None:
        """What llama.cpp does with windowed models (docs/llama-cpp/windows.md)."""
        self.capabilities = self.capabilities | WINDOW_CAPABILITIES
        self.model_limits = {**self.model_limits, **WINDOW_LIMITS}
        self.model_policy = {**self.model_policy, **WINDOW_POLICY}
        # llama.cpp's CPU GELU reads a float16 table (input and output rounded to binary16; measured: 1.6e-3 from
        # the tanh formula in float32, 7e-6 from the table's)
        self.activation_table = WINDOW_ACTIVATION_TABLE
        self.name = self.name[:-1] + f",gemma3{'' if self.engine.swa_full else ',swa_full off'}]"

    # -- models and contexts --

    def create_model(self, config: ModelConfig, weights: ModelWeights) -> LlamaModel:
        return LlamaModel(config, weights)

    def create_context(self, model: LlamaModel, config: ContextConfig) -> LlamaContext:
        kind = "unified" if config.unified else "per_sequence"
        if kind not in self.engine.contexts:
            raise UnsupportedModel(f"{self.name} is configured for {self.engine.contexts} contexts, not {kind}")
        return LlamaContext(model, config, self.engine)

    def context_cells(self, context: LlamaContext) -> int:
        return int(_Library.get().llama_n_ctx_seq(context.pointer))

    # -- decoding --

    def decode_batch(self, context: LlamaContext, batch: ModelBatch) -> np.ndarray:
        lib = _Library.get()
        count = len(batch.tokens)
        # a token may name several sequences (multi_sequence_tokens): n_seq_id of them, one cell they all hold
        rows = [(_int32(t, f"token {i}", MalformedBatch), _int32(p, f"position {i}", MalformedBatch),
                 [_int32(s, f"sequence {i}", MalformedBatch) for s in batch.sequences_of(i)])
                for i, (t, p) in enumerate(zip(batch.tokens, batch.positions))]
        native = lib.llama_batch_init(max(count, 1), 0, max([len(r[2]) for r in rows] + [1]))
        try:
            native.n_tokens = count
            for i, (token, position, sequences) in enumerate(rows):
                native.token[i], native.pos[i], native.n_seq_id[i] = token, position, len(sequences)
                for j, sequence in enumerate(sequences):
                    native.seq_id[i][j] = sequence
                native.logits[i] = 1 if batch.logits[i] else 0
            status = lib.llama_decode(context.pointer, native)
        finally:
            lib.llama_batch_free(native)
        if status == 1:
            raise ContextFull(f"llama_decode returned 1: no KV slot for {count} tokens", _Library.last())
        if status == -1:
            raise MalformedBatch("llama_decode returned -1: invalid input batch", _Library.last())
        if status != 0:
            raise EngineFailure(f"llama_decode returned {status}", _Library.last())
        vocab = context.model.vocab
        wanted = [i for i in range(count) if batch.logits[i]]
        logits = np.empty((len(wanted), vocab), dtype=np.float32)
        for row, index in enumerate(wanted):
            pointer = lib.llama_get_logits_ith(context.pointer, index)
            if not pointer:
                raise EngineFailure(f"llama_get_logits_ith({index}) returned NULL", _Library.last())
            logits[row] = np.ctypeslib.as_array(pointer, shape=(vocab,))
        return logits

    # -- the memory --

    def clear(self, context: LlamaContext) -> None:
        _Library.get().llama_memory_clear(context.memory, True)

    def seq_pos_min(self, context: LlamaContext, seq: int) -> int:
        return int(_Library.get().llama_memory_seq_pos_min(context.memory, _int32(seq, "seq", OperationRefused)))

    def seq_pos_max(self, context: LlamaContext, seq: int) -> int:
        return int(_Library.get().llama_memory_seq_pos_max(context.memory, _int32(seq, "seq", OperationRefused)))

    def can_shift(self, context: LlamaContext) -> bool:
        return bool(_Library.get().llama_memory_can_shift(context.memory))

    def seq_remove(self, context: LlamaContext, seq: int, p0: int, p1: int) -> None:
        args = self._ints(seq=seq, p0=p0, p1=p1)
        if not _Library.get().llama_memory_seq_rm(context.memory, *args):
            raise OperationRefused(f"llama_memory_seq_rm{tuple(args)} returned false", _Library.last())

    def seq_copy(self, context: LlamaContext, src: int, dst: int, p0: int, p1: int) -> None:
        _Library.get().llama_memory_seq_cp(context.memory, *self._ints(src=src, dst=dst, p0=p0, p1=p1))

    def seq_keep(self, context: LlamaContext, seq: int) -> None:
        _Library.get().llama_memory_seq_keep(context.memory, *self._ints(seq=seq))

    def seq_shift(self, context: LlamaContext, seq: int, p0: int, p1: int, delta: int) -> None:
        _Library.get().llama_memory_seq_add(context.memory, *self._ints(seq=seq, p0=p0, p1=p1, delta=delta))

    def seq_divide(self, context: LlamaContext, seq: int, p0: int, p1: int, d: int) -> None:
        _Library.get().llama_memory_seq_div(context.memory, *self._ints(seq=seq, p0=p0, p1=p1, d=d))

    def save_sequence(self, context: LlamaContext, seq: int) -> bytes:
        lib = _Library.get()
        seq = _int32(seq, "seq", OperationRefused)
        size = lib.llama_state_seq_get_size(context.pointer, seq)
        buffer = (ctypes.c_uint8 * max(size, 1))()
        written = lib.llama_state_seq_get_data(context.pointer, buffer, size, seq)
        if written != size:
            raise EngineFailure(f"llama_state_seq_get_data wrote {written} of {size} bytes", _Library.last())
        return bytes(buffer[:written])

    def load_sequence(self, context: LlamaContext, seq: int, state: Any) -> None:
        if not isinstance(state, bytes):
            raise OperationRefused(f"a saved sequence is bytes from save_sequence, got {type(state).__name__}")
        lib = _Library.get()
        seq = _int32(seq, "seq", OperationRefused)
        buffer = (ctypes.c_uint8 * max(len(state), 1)).from_buffer_copy(state or b"\0")
        if lib.llama_state_seq_set_data(context.pointer, buffer, len(state), seq) == 0:
            raise ContextFull(f"llama_state_seq_set_data into sequence {seq} returned 0 (failed to load)",
                              _Library.last())

    @staticmethod
    def _ints(**values: Any) -> list[int]:
        return [_int32(value, name, OperationRefused) for name, value in values.items()]

    def error_kind(self, error: BaseException) -> str | None:
        for error_type, kind in ERROR_KINDS.items():
            if isinstance(error, error_type):
                return kind
        return None


# -- the configurations measured (docs/llama-cpp/NOTES.md) ------------------------------------------------------

def make_adapter() -> LlamaCppAdapter:
    """f32 cache, flash attention off, both context kinds: the exact mode (float32 computation)."""
    return LlamaCppAdapter(LlamaCppConfig())


def make_f16_adapter() -> LlamaCppAdapter:
    """llama.cpp's default cache type."""
    return LlamaCppAdapter(LlamaCppConfig(cache_type="f16"))


def make_flash_adapter() -> LlamaCppAdapter:
    return LlamaCppAdapter(LlamaCppConfig(flash_attn=True))


def make_unified_adapter() -> LlamaCppAdapter:
    return LlamaCppAdapter(LlamaCppConfig(contexts=("unified",)))


def make_per_sequence_adapter() -> LlamaCppAdapter:
    return LlamaCppAdapter(LlamaCppConfig(contexts=("per_sequence",)))


def make_q8_0_adapter() -> LlamaCppAdapter:
    """q8_0 keys and values (flash attention, which a quantized V needs); head width 32, the rotation off."""
    return LlamaCppAdapter(LlamaCppConfig(cache_type="q8_0", flash_attn=True))


def make_q4_0_adapter() -> LlamaCppAdapter:
    return LlamaCppAdapter(LlamaCppConfig(cache_type="q4_0", flash_attn=True))


def make_q8_0_no_rotation_adapter() -> LlamaCppAdapter:
    """q8_0 with LLAMA_ATTN_ROT_DISABLE=1: head widths 32 and 64."""
    return LlamaCppAdapter(LlamaCppConfig(cache_type="q8_0", flash_attn=True, rotation=False))


def make_micro_batch_adapter() -> LlamaCppAdapter:
    """f32 cache with n_ubatch 3: a batch of more than 3 tokens is computed in ubatches, all or nothing (llama.h:
    "upon other return values, the memory state is restored"). Run by ``python -m adapters.llama_report --only
    micro_batch``."""
    return LlamaCppAdapter(LlamaCppConfig(micro_batch=3))


def make_windows_adapter() -> LlamaCppAdapter:
    """Windowed models (gemma3), f32 cache, flash attention off, both context kinds, swa_full on (the default)."""
    return LlamaCppAdapter(LlamaCppConfig(windows=True))


def make_windows_swa_small_adapter() -> LlamaCppAdapter:
    """Windowed models with swa_full off: the windowed store sized for the window (256 cells at least)."""
    return LlamaCppAdapter(LlamaCppConfig(windows=True, swa_full=False))


def make_windows_f16_adapter() -> LlamaCppAdapter:
    return LlamaCppAdapter(LlamaCppConfig(windows=True, swa_full=False, cache_type="f16"))


def make_windows_flash_adapter() -> LlamaCppAdapter:
    return LlamaCppAdapter(LlamaCppConfig(windows=True, swa_full=False, flash_attn=True))


def make_windows_unified_adapter() -> LlamaCppAdapter:
    return LlamaCppAdapter(LlamaCppConfig(windows=True, swa_full=False, contexts=("unified",)))


def make_windows_per_sequence_adapter() -> LlamaCppAdapter:
    return LlamaCppAdapter(LlamaCppConfig(windows=True, swa_full=False, contexts=("per_sequence",)))


def make_isolated_adapter() -> Isolated:
    """``make_adapter`` in a child process: an engine abort is a "crash" verdict, not the end of the run."""
    return isolated("adapters.llama_cpp:make_adapter")


def make_isolated_f16_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_f16_adapter")


def make_isolated_flash_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_flash_adapter")


def make_isolated_unified_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_unified_adapter")


def make_isolated_per_sequence_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_per_sequence_adapter")


def make_isolated_q8_0_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_q8_0_adapter")


def make_isolated_q4_0_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_q4_0_adapter")


def make_isolated_q8_0_no_rotation_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_q8_0_no_rotation_adapter")


def make_isolated_micro_batch_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_micro_batch_adapter")


def make_isolated_windows_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_windows_adapter")


def make_isolated_windows_swa_small_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_windows_swa_small_adapter")


def make_isolated_windows_f16_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_windows_f16_adapter")


def make_isolated_windows_flash_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_windows_flash_adapter")


def make_isolated_windows_unified_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_windows_unified_adapter")


def make_isolated_windows_per_sequence_adapter() -> Isolated:
    return isolated("adapters.llama_cpp:make_windows_per_sequence_adapter")
