"""Measure llama.cpp (llama-cpp-python 0.3.36) against the float64 oracle: the numbers in NOTES.md.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python docs/llama-cpp/measure.py precision     # per model and cache config
    OPENBLAS_NUM_THREADS=1 .venv/bin/python docs/llama-cpp/measure.py operations    # each memory op, by hand
    OPENBLAS_NUM_THREADS=1 .venv/bin/python docs/llama-cpp/measure.py errors        # return codes, asserts

Every number is the worst |logit error| against ``oracle.model`` in float64 (the same cell model the machine
uses), over every logit a program asks for, and that error over the largest |logit| (relative).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from adapters.llama_cpp import LlamaCppAdapter, LlamaCppConfig
from kvcache_conformance.oracle.model import CellContext, Model
from kvcache_conformance.oracle.model_config import (
    ContextConfig,
    ModelBatch,
    ModelConfig,
    random_model_weights,
)
from kvcache_conformance.protocol.isolation import EngineDied, isolated


class Pair:
    """One llama.cpp context and the oracle's cell context, driven together."""

    def __init__(self, adapter: LlamaCppAdapter, config: ModelConfig, seed: int, context: ContextConfig,
                 model: Any = None) -> None:
        self.adapter, self.config = adapter, config
        weights = random_model_weights(config, seed)
        self.model = model or adapter.create_model(config, weights)
        self.context = adapter.create_context(self.model, context)
        copy = adapter.model_policy["copy_unified" if context.unified else "copy_per_sequence"]
        self.oracle_model = Model(config, weights)
        self.oracle = CellContext(self.oracle_model, context, shared_copies=True, copy_into_nonempty=copy,
                                  stream_cells=adapter.context_cells(self.context))
        self.worst, self.scale = 0.0, 0.0

    def decode(self, batch: ModelBatch) -> None:
        got = self.adapter.decode_batch(self.context, batch)
        expected = self.oracle.decode(batch)
        self.worst = max(self.worst, float(np.max(np.abs(got - expected))))
        self.scale = max(self.scale, float(np.max(np.abs(expected))))

    def op(self, name: str, *args: Any) -> None:
        getattr(self.adapter, name)(self.context, *args)
        oracle_name = {"seq_remove": "remove", "seq_copy": "copy", "seq_keep": "keep", "seq_shift": "shift",
                       "seq_divide": "divide"}[name]
        getattr(self.oracle, oracle_name)(*args)

    def positions(self, seqs: range) -> list[tuple[int, int, int, int]]:
        """(engine min, max, oracle min, max) per sequence."""
        return [(self.adapter.seq_pos_min(self.context, s), self.adapter.seq_pos_max(self.context, s),
                 self.oracle.pos_min(s), self.oracle.pos_max(s)) for s in seqs]

    def positions_agree(self, seqs: range) -> bool:
        return all(a == c and b == d for a, b, c, d in self.positions(seqs))

    def result(self) -> str:
        return f"{self.worst:.2e} (rel {self.worst / max(self.scale, 1e-300):.1e})"


def tokens(n: int, vocab: int, offset: int = 3) -> list[int]:
    return [offset + (7 * i) % (vocab - offset) for i in range(n)]


# -- precision ------------------------------------------------------------------------------------------------

MODELS = {
    "D32 H4/KV2 dh8 (GQA)": ModelConfig(vocab=32, model_width=32, layers=2, heads=4, kv_heads=2, head_width=8,
                                        ffn_width=48, max_positions=128),
    "D32 H4/KV1 dh8 (MQA)": ModelConfig(vocab=32, model_width=32, layers=2, heads=4, kv_heads=1, head_width=8,
                                        ffn_width=48, max_positions=128),
    "D16 H2/KV2 dh4 tied": ModelConfig(vocab=24, model_width=16, layers=2, heads=2, kv_heads=2, head_width=4,
                                       ffn_width=24, tied_output=True, max_positions=128),
    "D32 H2/KV1 dh12, base 5e5": ModelConfig(vocab=32, model_width=32, layers=2, heads=2, kv_heads=1, head_width=12,
                                             ffn_width=40, rope_base=500000.0, max_positions=128),
    "D32 H4/KV2 dh8 half_split": ModelConfig(vocab=32, model_width=32, layers=2, heads=4, kv_heads=2, head_width=8,
                                             ffn_width=48, rope_style="half_split", max_positions=128),
    "D64 H2/KV1 dh32": ModelConfig(vocab=32, model_width=64, layers=1, heads=2, kv_heads=1, head_width=32,
                                   ffn_width=64, max_positions=128),
    "D64 H2/KV1 dh64": ModelConfig(vocab=32, model_width=64, layers=1, heads=2, kv_heads=1, head_width=64,
                                   ffn_width=64, max_positions=128),
    "D64 H1/KV1 dh128": ModelConfig(vocab=32, model_width=64, layers=1, heads=1, kv_heads=1, head_width=128,
                                    ffn_width=64, max_positions=128),
}
ENGINES = {
    "f32": LlamaCppConfig(),
    "f16": LlamaCppConfig(cache_type="f16"),
    "f32+flash": LlamaCppConfig(flash_attn=True),
    "f16+flash": LlamaCppConfig(cache_type="f16", flash_attn=True),
    "q8_0+flash": LlamaCppConfig(cache_type="q8_0", flash_attn=True),
    "q4_0+flash": LlamaCppConfig(cache_type="q4_0", flash_attn=True),
}


def prompt_error(engine: LlamaCppConfig, config: ModelConfig, unified: bool = True, n: int = 12) -> str:
    pair = Pair(LlamaCppAdapter(engine), config, seed=1, context=ContextConfig(cells=64, max_sequences=2,
                                                                                 unified=unified))
    pair.decode(ModelBatch.of_sequence(0, tokens(n, config.vocab), 0))  # a prompt, every logit
    for step in range(4):  # then single tokens
        pair.decode(ModelBatch.of_sequence(0, [3 + step], n + step))
    return pair.result()


def precision() -> None:
    quantized = [name for name, e in ENGINES.items() if e.cache_type in ("q8_0", "q4_0")]
    print(f"| model | {' | '.join(ENGINES)} |")
    print(f"|---|{'---|' * len(ENGINES)}")
    for name, config in MODELS.items():
        cells = []
        for engine_name, engine in ENGINES.items():
            if engine_name in quantized and config.head_width % 32:
                cells.append("n/a (dh % 32)")
                continue
            cells.append(prompt_error(engine, config))
        print(f"| {name} | {' | '.join(cells)} |", flush=True)
    config = MODELS["D32 H4/KV2 dh8 (GQA)"]
    print(f"\nkv_unified=false, f32: {prompt_error(ENGINES['f32'], config, unified=False)}; "
          f"kv_unified=true: {prompt_error(ENGINES['f32'], config, unified=True)}")


def rotation() -> None:
    """q8_0 / q4_0 with dh 64 and 128, with and without LLAMA_ATTN_ROT_DISABLE (read when a context is made)."""
    for disable in (False, True):
        env = {**os.environ, **({"LLAMA_ATTN_ROT_DISABLE": "1"} if disable else {})}
        env.pop("LLAMA_ATTN_ROT_DISABLE", None) if not disable else None
        out = subprocess.run([sys.executable, __file__, "rotation-child"], env=env, capture_output=True, text=True,
                             check=True).stdout
        print(f"LLAMA_ATTN_ROT_DISABLE={'1' if disable else '(unset)'}:\n{out}")


def rotation_child() -> None:
    for name in ("D64 H2/KV1 dh32", "D64 H2/KV1 dh64", "D64 H1/KV1 dh128"):
        print(f"  {name}: " + ", ".join(f"{e} {prompt_error(ENGINES[e], MODELS[name])}"
                                          for e in ("q8_0+flash", "q4_0+flash")), flush=True)


# -- each memory operation, by hand ---------------------------------------------------------------------------

SMALL = ModelConfig(vocab=32, model_width=32, layers=2, heads=4, kv_heads=2, head_width=8, ffn_width=48,
                    max_positions=128)


def operation_programs() -> dict[str, tuple[bool | None, Callable[[Pair], None]]]:
    """name -> (unified only? None: both kinds, the program)."""
    v = SMALL.vocab

    def prompt(p: Pair, seq: int = 0, n: int = 8, start: int = 0, offset: int = 3) -> None:
        p.decode(ModelBatch.of_sequence(seq, tokens(n, v, offset), start))

    def remove_end(p: Pair) -> None:
        prompt(p)
        p.op("seq_remove", 0, 5, -1)
        p.decode(ModelBatch.of_sequence(0, [9], 5))

    def remove_middle(p: Pair) -> None:
        prompt(p)
        p.op("seq_remove", 0, 2, 4)
        p.decode(ModelBatch.of_sequence(0, [9, 10], 8))

    def remove_every_sequence(p: Pair) -> None:
        prompt(p)
        prompt(p, seq=1, offset=5)
        p.op("seq_remove", -1, 4, -1)
        p.decode(ModelBatch(tokens=(9, 10), positions=(4, 4), sequences=(0, 1), logits=(True, True)))

    def batch_mixing_sequences(p: Pair) -> None:
        p.decode(ModelBatch(tokens=(3, 4, 5, 6, 7, 8), positions=(0, 0, 1, 1, 2, 2), sequences=(0, 1, 0, 1, 0, 1),
                            logits=(True,) * 6))

    def copy_whole(p: Pair) -> None:
        prompt(p)
        p.op("seq_copy", 0, 1, -1, -1)
        p.decode(ModelBatch(tokens=(9, 11), positions=(8, 8), sequences=(0, 1), logits=(True, True)))

    def copy_range(p: Pair) -> None:
        prompt(p)
        p.op("seq_copy", 0, 1, 0, 4)
        p.decode(ModelBatch.of_sequence(1, [11, 12], 4))

    def copy_into_nonempty(p: Pair) -> None:
        prompt(p)
        prompt(p, seq=1, n=3, offset=9)
        p.op("seq_copy", 0, 1, 3, -1)  # seq 1: its own 0..2, then seq 0's 3..7 (merge)
        p.decode(ModelBatch.of_sequence(1, [12], 8))

    def copy_then_shift_shared(p: Pair) -> None:
        prompt(p)
        p.op("seq_copy", 0, 1, -1, -1)
        p.op("seq_shift", 1, 4, -1, 2)  # shared cells: moves them for sequence 0 too
        p.decode(ModelBatch(tokens=(9, 11), positions=(10, 10), sequences=(0, 1), logits=(True, True)))

    def keep(p: Pair) -> None:
        prompt(p)
        prompt(p, seq=1, n=5, offset=6)
        p.op("seq_keep", 1)
        p.decode(ModelBatch.of_sequence(1, [13], 5))

    def shift_after_removal(p: Pair) -> None:
        prompt(p)
        p.op("seq_remove", 0, 2, 4)
        p.op("seq_shift", 0, 4, -1, -2)
        p.decode(ModelBatch.of_sequence(0, [9, 10], 6))

    def shift_up(p: Pair) -> None:
        prompt(p)
        p.op("seq_shift", 0, -1, -1, 5)
        p.decode(ModelBatch.of_sequence(0, [9], 13))

    def shift_below_zero(p: Pair) -> None:
        prompt(p)
        p.op("seq_shift", 0, 0, 3, -2)  # positions 0, 1 leave: below 0
        p.decode(ModelBatch.of_sequence(0, [9], 8))

    def divide(p: Pair) -> None:
        prompt(p)
        p.op("seq_divide", 0, -1, -1, 2)
        p.decode(ModelBatch.of_sequence(0, [9], 4))

    def divide_range(p: Pair) -> None:
        prompt(p)
        p.op("seq_divide", 0, 4, -1, 2)  # 4..7 -> 2, 2, 3, 3
        p.decode(ModelBatch.of_sequence(0, [9], 4))

    def clear(p: Pair) -> None:
        prompt(p)
        p.adapter.clear(p.context)
        p.oracle.clear()
        prompt(p, offset=4)

    return {"remove at the end": (None, remove_end), "remove in the middle": (None, remove_middle),
            "remove from every sequence (seq -1)": (None, remove_every_sequence),
            "a batch mixing sequences": (None, batch_mixing_sequences), "copy whole": (None, copy_whole),
            "copy a range": (True, copy_range), "copy into a non-empty sequence": (True, copy_into_nonempty),
            "copy, then shift the copy (shared cells)": (True, copy_then_shift_shared), "keep": (None, keep),
            "shift down after a removal": (None, shift_after_removal), "shift up": (None, shift_up),
            "shift below 0": (None, shift_below_zero), "divide (whole)": (None, divide),
            "divide a range": (None, divide_range), "clear": (None, clear)}


def save_load(unified: bool) -> list[str]:
    adapter = LlamaCppAdapter()
    lines = []
    for target, before in itertools.product(("same id", "other id", "fresh context"),
                                            ("no shift", "a shift", "a shift, then a decode")):
        pair = Pair(adapter, SMALL, 1, ContextConfig(cells=64, max_sequences=2, unified=unified))
        pair.decode(ModelBatch.of_sequence(0, tokens(8, SMALL.vocab), 0))
        if before != "no shift":
            pair.op("seq_shift", 0, 4, -1, 3)  # a shifted state: saved as it is now
        if before == "a shift, then a decode":
            pair.decode(ModelBatch.of_sequence(1, [5], 0))  # another sequence's decode applies the pending shift
            pair.op("seq_remove", 1, -1, -1)
        state, saved = adapter.save_sequence(pair.context, 0), pair.oracle.save(0)
        if target == "fresh context":
            pair.context = adapter.create_context(pair.model, ContextConfig(cells=64, max_sequences=2,
                                                                             unified=unified))
            pair.oracle = CellContext(pair.oracle_model, ContextConfig(cells=64, max_sequences=2, unified=unified),
                                      stream_cells=adapter.context_cells(pair.context))
        seq = 1 if target == "other id" else 0
        if target == "same id":
            pair.op("seq_remove", 0, -1, -1)
        adapter.load_sequence(pair.context, seq, state)
        pair.oracle.load(seq, saved)
        agree = pair.positions_agree(range(2))
        pair.decode(ModelBatch.of_sequence(seq, [9], pair.oracle.pos_max(seq) + 1))
        kind = "unified" if unified else "per-sequence"
        lines.append(f"| save after {before}, load into {target} | {kind} | {pair.result()} | "
                     f"{'agree' if agree else pair.positions(range(2))} | {len(state)} bytes |")
    return lines


def operations() -> None:
    print("| operation | context | worst logit error | seq_pos_min/max vs oracle |")
    print("|---|---|---|---|")
    for name, (unified_only, program) in operation_programs().items():
        for unified in (True, False):
            if unified_only and not unified:
                continue
            pair = Pair(LlamaCppAdapter(), SMALL, 1, ContextConfig(cells=64, max_sequences=2, unified=unified))
            try:
                program(pair)
                agree = pair.positions_agree(range(2))
                print(f"| {name} | {'unified' if unified else 'per-sequence'} | {pair.result()} | "
                      f"{'agree' if agree else pair.positions(range(2))} |", flush=True)
            except Exception as error:
                print(f"| {name} | {'unified' if unified else 'per-sequence'} | raised {type(error).__name__}: "
                      f"{error} | |", flush=True)
    for unified in (True, False):
        print("\n".join(save_load(unified)), flush=True)


# -- errors: return codes and what aborts ---------------------------------------------------------------------

def _error_case(name: str, unified: bool) -> str:
    """One case of ``errors``, in this process (run in a child: some abort)."""
    adapter = LlamaCppAdapter()
    model = adapter.create_model(SMALL, random_model_weights(SMALL, 1))
    context = adapter.create_context(model, ContextConfig(cells=64, max_sequences=2, unified=unified))
    adapter.decode_batch(context, ModelBatch.of_sequence(0, tokens(4, SMALL.vocab), 0))  # seq 0 holds 0..3
    case = ERROR_CASES[name]
    try:
        result = case(adapter, context)
    except Exception as error:
        return f"{type(error).__name__} ({adapter.error_kind(error)}): {error}"
    held = f"{adapter.seq_pos_min(context, 0)}..{adapter.seq_pos_max(context, 0)}"
    return f"accepted, returned {result!r}; seq 0 holds {held}"


ERROR_CASES: dict[str, Callable[[Any, Any], Any]] = {
    "token = vocab": lambda a, c: a.decode_batch(c, ModelBatch.of_sequence(0, [SMALL.vocab], 4)),
    "token -1": lambda a, c: a.decode_batch(c, ModelBatch.of_sequence(0, [-1], 4)),
    "empty batch": lambda a, c: a.decode_batch(c, ModelBatch((), (), (), ())),
    "sequence = n_seq_max": lambda a, c: a.decode_batch(c, ModelBatch.of_sequence(2, [3], 0)),
    "positions not after seq_pos_max (5, 6)": lambda a, c: a.decode_batch(c, ModelBatch.of_sequence(0, [3, 4], 5)),
    "positions 1, 0 (empty seq 1)": lambda a, c: a.decode_batch(c, ModelBatch((3, 4), (1, 0), (1, 1), (True, True))),
    "position -1 (empty seq 1)": lambda a, c: a.decode_batch(c, ModelBatch.of_sequence(1, [3], -1)),
    "more tokens than n_ctx asked (65 > 64)":
        lambda a, c: a.decode_batch(c, ModelBatch.of_sequence(1, tokens(65, 32), 0)),
    "more tokens than context_cells (257)":
        lambda a, c: a.decode_batch(c, ModelBatch.of_sequence(1, tokens(257, 32), 0)),
    "seq_remove a partial range of seq 0": lambda a, c: a.seq_remove(c, 0, 1, 2),
    "seq_remove seq 2 (n_seq_max 2)": lambda a, c: a.seq_remove(c, 2, -1, -1),
    "seq_copy 0 -> 2": lambda a, c: a.seq_copy(c, 0, 2, -1, -1),
    "seq_copy a range 0 -> 1": lambda a, c: a.seq_copy(c, 0, 1, 0, 2),
    "seq_keep 2": lambda a, c: a.seq_keep(c, 2),
    "seq_shift seq 2": lambda a, c: a.seq_shift(c, 2, -1, -1, 1),
    "seq_divide d=0": lambda a, c: a.seq_divide(c, 0, -1, -1, 0),
    "seq_divide d=-1": lambda a, c: a.seq_divide(c, 0, -1, -1, -1),
    "seq_pos_max seq 2": lambda a, c: a.seq_pos_max(c, 2),
    "load a truncated state": lambda a, c: a.load_sequence(c, 1, a.save_sequence(c, 0)[:-7]),
}


def errors() -> None:
    """Every case in a child process of its own (protocol/isolation.py): an abort is reported, not fatal."""
    print("| case | context | what llama.cpp did |")
    print("|---|---|---|")
    for name in ERROR_CASES:
        for unified in (True, False):
            proxy = isolated(_Cases)
            try:
                outcome = proxy.run(name, unified)
            except EngineDied as died:
                last = [line for line in died.stderr_tail.splitlines() if "GGML_ASSERT" in line or "error" in line]
                outcome = f"**process died ({died.cause})**: {last[-1].split('/src/')[-1] if last else ''}"
            finally:
                proxy.stop()
            print(f"| {name} | {'unified' if unified else 'per-sequence'} | {outcome} |", flush=True)


class _Cases:
    """The child's side of ``errors`` (picklable: a module-level class)."""

    name = version = "llama.cpp error cases"
    capabilities = frozenset()

    def run(self, name: str, unified: bool) -> str:
        return _error_case(name, unified)

    def error_kind(self, error: BaseException) -> str | None:
        return None


if __name__ == "__main__":
    start = time.perf_counter()
    {"precision": precision, "rotation": rotation, "rotation-child": rotation_child, "operations": operations,
     "errors": errors}[sys.argv[1]]()
    if sys.argv[1] != "rotation-child":
        print(f"\n({time.perf_counter() - start:.0f} s)")
