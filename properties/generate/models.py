"""What the model machine draws (docs/spec.md §15): tiny Llama-family models and contexts, within what the adapter
declares (its RoPE pairings, ``gqa``, ``sliding_window``, ``model_limits``, the contexts of its ``model_policy``).

Models stay tiny -- the oracle recomputes in scalar Python -- and positions stay far below ``MAX_POSITIONS``,
so a shift or a prompt never leaves the model's positions (the machine keeps them under ``POSITION_CEILING``),
but for the one rule that shifts past them on purpose (docs/spec.md §15.4: outside the model, not judged but
by §5.1).
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from ..oracle import ContextConfig, ModelConfig
from ..oracle.model_config import GEMMA3_SWITCHES
from ..protocol.kinds import Capability
from ..protocol.model import ModelLimits, ModelPolicy

MAX_POSITIONS = 64  # the model's max_positions
POSITION_CEILING = 40  # no drawn position (after prompts or shifts) goes past it
MAX_SEQUENCES, MAX_CELLS, MAX_PROMPT = 3, 16, 4


def _bounded(upper: int, limit: int | None) -> int:
    return upper if limit is None else min(upper, limit)


@st.composite
def model_configs(draw: st.DrawFn, capabilities: frozenset[str], limits: ModelLimits, *,
                  windowed_stores: bool = False) -> ModelConfig:
    """A tiny model: vocab 2-12, 1-2 layers, 1-2 kv heads times a group of 1-2 (GQA only if declared), head
    width the narrowest two of 2, 4, 32, 64 within the limits (a ``head_width_multiple`` is honoured; with a
    ``kv_width_multiple``, of 2, 4, 16, 32, 64 and with kv heads that make whole kv rows of it), model
    width 2-8 (a multiple of the heads where ``model_width_divisible_by_heads``), FFN 2-8, a declared RoPE
    pairing, a window only if ``sliding_window`` is declared (three in four for an adapter whose stores evict,
    ``windowed_stores``), tied or untied.

    Widened only for an adapter declaring more (a Llama-only adapter's draws are as before): an architecture among
    ``model_limits`` ``architectures`` (``gemma3``: every Gemma switch on, RoPE ``half_split``); with
    ``interleaved_windows`` and a window, 2-3 layers (``k`` or ``k + 1`` under a ``window_pattern`` limit ``k``), a
    window pattern (every layer, every second or third layer global, or one bool per layer) and a local RoPE base
    (none, or the one of 10000 and 100 the global base is not; the ``local_rope_base`` limit where declared),
    a model with a local base taking heads of the next width where 2 was drawn (a head of 2 would hide the base)."""
    architecture = "llama"
    if limits.architectures != ("llama",):
        architecture = draw(st.sampled_from(limits.architectures), label="architecture")
    styles = [s for s in ("interleaved", "half_split") if f"rope_{s}" in capabilities
              and (architecture != "gemma3" or s == "half_split")]
    style = draw(st.sampled_from(styles), label="rope style")
    widest = _bounded(8, limits.max_model_width)
    most_heads = _bounded(4, limits.max_heads)
    if limits.model_width_divisible_by_heads:  # at least one width 2..widest is a multiple of the heads
        most_heads = min(most_heads, widest)
    row = limits.kv_width_multiple  # KV * dh a multiple of it: heads of 16 too, two of them making a row of 32

    def kv_choices(width: int) -> list[int]:
        return [k for k in range(1, min(2, most_heads) + 1) if not row or (k * width) % row == 0]

    widths = [w for w in ((2, 4, 16, 32, 64) if row else (2, 4, 32, 64)) if w <= _bounded(64, limits.max_head_width)
              and w >= (limits.min_head_width or 0) and w % (limits.head_width_multiple or 1) == 0 and kv_choices(w)]
    head_width = draw(st.sampled_from(widths[:2]), label="head width")
    kv_heads = (draw(st.sampled_from(kv_choices(head_width)), label="kv heads") if row
                else draw(st.integers(1, min(2, most_heads)), label="kv heads"))
    groups = 2 if Capability.GQA.value in capabilities else 1
    group = draw(st.integers(1, max(1, min(groups, most_heads // kv_heads))), label="group")
    heads = kv_heads * group
    window = None
    # a store that evicts is met only in a windowed model: three in four are, for such an adapter
    if Capability.SLIDING_WINDOW.value in capabilities and draw(
            st.sampled_from((False, True, True, True)) if windowed_stores else st.booleans(), label="windowed"):
        # a store that evicts brings an evicted cell back into view by a removal only where W >= 3: those first
        least = limits.min_window or 1
        window = draw(st.sampled_from([w for w in (3, 4, 2, 1) if w >= least] or [least]) if windowed_stores
                      else st.integers(min(least, 4), max(least, 4)), label="window")
    fewest = max(2, limits.min_vocab or 2)
    vocab = draw(st.integers(fewest, max(fewest, _bounded(12, limits.max_vocab))), label="vocab")
    if limits.model_width_divisible_by_heads:
        model_width = draw(st.sampled_from([w for w in range(2, widest + 1) if w % heads == 0] or [heads]),
                           label="model width")
    else:
        model_width = draw(st.integers(2, widest), label="model width")
    interleaved = window is not None and Capability.INTERLEAVED_WINDOWS.value in capabilities
    most_layers = _bounded(3 if interleaved else 2, limits.max_layers)
    fewest_layers = min(2, most_layers) if interleaved else 1  # layers that may differ
    if interleaved and limits.window_pattern is not None:  # the one pattern built: its first global layer, and
        most_layers = _bounded(limits.window_pattern + 1, limits.max_layers)  # a windowed one after it
        fewest_layers = min(limits.window_pattern, most_layers)
    config = ModelConfig(
        vocab=vocab, model_width=model_width,
        layers=draw(st.integers(fewest_layers, most_layers), label="layers"),
        heads=heads, kv_heads=kv_heads, head_width=head_width,
        ffn_width=draw(st.integers(2, _bounded(8, limits.max_ffn_width)), label="ffn width"),
        rope_style=style, rope_base=draw(st.sampled_from([10000.0, 100.0]), label="rope base"),
        tied_output=draw(st.booleans(), label="tied"), window=window, max_positions=MAX_POSITIONS)
    widened: dict[str, object] = {}
    if interleaved:
        widened["window_pattern"] = limits.window_pattern or draw(window_patterns(config.layers), label="pattern")
        if limits.local_rope_base is not None:
            widened["local_rope_base"] = limits.local_rope_base
        elif draw(st.booleans(), label="local rope base"):  # one that differs from the global base
            widened["local_rope_base"] = 100.0 if config.rope_base == 10000.0 else 10000.0
        # a head of 2 turns by the position alone, whatever the base: a local base shows from heads of the next width
        wider = [w for w in widths[1:2] if not row or (kv_heads * w) % row == 0]
        if "local_rope_base" in widened and head_width == 2 and wider:
            widened["head_width"] = wider[0]
    if architecture == "gemma3":
        widened |= GEMMA3_SWITCHES
    return dataclasses.replace(config, **widened) if widened else config


def window_patterns(layers: int) -> st.SearchStrategy[str | int | tuple[bool, ...]]:
    """Which layers a window applies to: every one, every second or third global, or one drawn bool per layer."""
    return st.one_of(st.sampled_from(["all", 2, 3]), st.tuples(*[st.booleans()] * layers))


def context_cells(unified: bool, sequences: int, limits: ModelLimits) -> tuple[int, int]:
    """The fewest and most cells the suite asks of a context: 6-16 (per-sequence: at least 3 for each; with a
    ``micro_batch`` u, at least 2u + 2: a batch of 2u + 1 tokens fits), within ``max_cells``."""
    most = _bounded(MAX_CELLS, limits.max_cells)
    least = 6 if unified else 3 * sequences
    if limits.micro_batch is not None:
        least = max(least, 2 * limits.micro_batch + 2)
    return min(most, least), most


@st.composite
def context_configs(draw: st.DrawFn, policy: ModelPolicy, limits: ModelLimits) -> ContextConfig:
    """A context of a declared kind: 2-3 sequences, 6-16 cells (per-sequence: at least 3 for each)."""
    unified = draw(st.sampled_from(sorted(k == "unified" for k in policy.contexts)), label="unified")
    most = _bounded(MAX_SEQUENCES, limits.max_sequences)
    sequences = draw(st.integers(min(2, most), most), label="sequences")
    cells = draw(st.integers(*context_cells(unified, sequences, limits)), label="cells")
    return ContextConfig(cells=cells, max_sequences=sequences, unified=unified)


SINKS = (0, 1, 2)  # kept sink tokens drawn for an adapter declaring attention_sinks (docs/spec.md §15.2)


def context_sinks(capabilities: frozenset[str], config: ModelConfig) -> st.SearchStrategy[int]:
    """The kept sink tokens of a context: 0, 1 or 2 for a windowed model of an adapter declaring
    ``attention_sinks``; none for any other (it is never handed sinks)."""
    if Capability.ATTENTION_SINKS.value in capabilities and config.window is not None:
        return st.sampled_from(SINKS)
    return st.just(0)


def model_requirements(config: ModelConfig) -> set[str]:
    """The capabilities an adapter must declare to be offered a drawn model."""
    needs = {f"rope_{config.rope_style}"}
    if config.kv_heads < config.heads:
        needs.add(Capability.GQA.value)
    if config.window is not None:
        needs.add(Capability.SLIDING_WINDOW.value)
    if config.interleaved:
        needs.add(Capability.INTERLEAVED_WINDOWS.value)
    return needs
