"""Deliberately broken copies of the reference implementation.

Each mutant is a few exact source edits of one ``impl`` file. ``build``
copies the whole ``impl`` package under a new name, applies the edits (each
must match exactly once, so a mutant cannot silently rot when ``impl``
changes) and returns the spec of the copy's own adapter, loadable like any
third-party implementation.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMPL = Path(__file__).resolve().parent.parent / "impl"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    edits: tuple[tuple[str, str], ...]
    why: str
    machine: str = "layer cache"  # the machine that kills it (runs_for)
    undeclared: tuple[str, ...] = ()  # capabilities its adapter no longer declares
    factory: str = "make_adapter"  # the adapter factory of impl/conformance.py it runs behind ("module:name" elsewhere)
    examples: int = 100  # the ci profile's budget, raised only for a mutant that hides in a narrow corner (say why)


MUTANTS = (
    Mutant("rope_at_new_length", "attention.py",
           (("start = cache.next_position\n", "start = cache.next_position + 1\n"),),
           "rotates q and k at the new length instead of the old"),
    Mutant("values_rotated", "attention.py",
           (("key = self.rope.rotate_with(key, angles)\n",
             "key = self.rope.rotate_with(key, angles)\n            value = self.rope.rotate_with(value, angles)\n"),),
           "stores values rotated"),
    Mutant("key_written_before_value_checked", "attention.py",
           (('_require_finite(NonFiniteKeyValue, "projected value", value)',
             'cache._keys[:, :, cache.length] = key[:, :, 0]\n'
             '            _require_finite(NonFiniteKeyValue, "projected value", value)'),),
           "writes the key row before the value row is known to be finite"),
    Mutant("reset_reallocates", "cache.py",
           (("        self._length = self._next_position = self._first_held = 0\n",
             "        self._keys, self._values = np.zeros_like(self._keys), np.zeros_like(self._values)\n"
             "        self._length = self._next_position = self._first_held = 0\n"),),
           "reset allocates new buffers"),
    Mutant("reset_zeroes", "cache.py",
           (("        self._length = self._next_position = self._first_held = 0\n",
             "        self._keys[...] = 0.0\n        self._values[...] = 0.0\n"
             "        self._length = self._next_position = self._first_held = 0\n"),),
           "reset overwrites the stored rows"),
    Mutant("no_revision_check", "cache.py",
           (("            if current.version != version:", "            if False:"),),
           "accepts a layer whose parameters were updated in place"),
    Mutant("no_identity_check", "cache.py",
           (("            if recorded is not current:", "            if False:"),),
           "accepts a recreated layer with equal values"),
    Mutant("rope_base_with_tolerance", "rope.py",
           (("and _bits(self.base) == _bits(other.base))",
             "and abs(self.base - other.base) <= 1e-9 * abs(other.base))"),),
           "compares the RoPE base with a tolerance instead of bit for bit"),
    Mutant("full_check_off_by_one", "attention.py",
           (("if cache.length + x.shape[1] > cache.capacity:",
             "if cache.length + x.shape[1] > cache.capacity + 1:"),),
           "lets a full cache take one more row"),
    Mutant("unstable_softmax", "attention.py",
           (("    scores -= scores.max(axis=-1, keepdims=True)\n", ""),),
           "softmax without subtracting the row maximum"),
    Mutant("gqa_head_mapping_modulo", "attention.py",
           (("grouped = query.reshape(batch, kv_heads, -1, tokens, dh)",
             "grouped = query.reshape(batch, -1, kv_heads, tokens, dh).swapaxes(1, 2)"),
            ("merged: np.ndarray = mixed.reshape(batch, heads, tokens, dh)",
             "merged: np.ndarray = mixed.swapaxes(1, 2).reshape(batch, heads, tokens, dh)")),
           "query head h reads kv head h % KV instead of h // (H / KV)"),
    Mutant("storage_layout_bckd", "cache.py",
           (("shape = (batch_size, layer.kv_heads, slots, layer.head_width)",
             "shape = (batch_size, slots, layer.kv_heads, layer.head_width)"),
            ("= self._keys[:, :, self._held_slots()]", "= self._keys[:, self._held_slots()].swapaxes(1, 2)"),
            ("= self._values[:, :, self._held_slots()]", "= self._values[:, self._held_slots()].swapaxes(1, 2)"),
            ("return (_read_only(self._keys[:, :, held]), _read_only(self._values[:, :, held]),",
             "return (_read_only(self._keys[:, held].swapaxes(1, 2)), "
             "_read_only(self._values[:, held].swapaxes(1, 2)),"),
            ("return self._keys[:, :, slots], self._values[:, :, slots], self._positions[slots]",
             "return (self._keys[:, slots].swapaxes(1, 2), self._values[:, slots].swapaxes(1, 2),\n"
             "                self._positions[slots])"),
            ("self._exact_keys[:, :, slots] = keys[:, :, tokens - kept:]",
             "self._exact_keys[:, slots] = keys[:, :, tokens - kept:].swapaxes(1, 2)"),
            ("self._exact_values[:, :, slots] = values[:, :, tokens - kept:]",
             "self._exact_values[:, slots] = values[:, :, tokens - kept:].swapaxes(1, 2)"),
            ("self._keys[:, :, :count] = self._exact_keys[:, :, :count] = keys",
             "self._keys[:, :count] = keys.swapaxes(1, 2)"),
            ("self._values[:, :, :count] = self._exact_values[:, :, :count] = values",
             "self._values[:, :count] = values.swapaxes(1, 2)")),
           "physical storage laid out [B, C, KV, dh], logically correct"),
    Mutant("no_rope_max_positions_check", "rope.py",
           (("and self.max_positions == other.max_positions\n", "\n"),),
           "ignores a change of RoPE position capacity"),
    Mutant("rotary_width_ignored", "attention.py",
           (("angles = self.rope.angles(positions, self.functions)  # one table for queries and keys",
             "angles = type(self.rope)(self.rope.style, self.rope.base, self.head_width, self.rope.max_positions)"
             ".angles(positions, self.functions)"),),
           "rotates every feature of a head even under partial rotary"),
    Mutant("query_not_rotated", "attention.py",
           (("query = self.rope.rotate_with(query, angles)\n", "\n"),),
           "rotates keys but not the new query"),
    Mutant("scale_by_head_width", "attention.py",
           (("scores /= math.sqrt(dh)", "scores /= dh"),),
           "scales scores by 1/dh instead of 1/sqrt(dh)"),
    Mutant("non_finite_input_accepted", "attention.py",
           (('_require_finite(NonFiniteInput, "input", x)', "pass"),
            ('_require_finite(NonFiniteKeyValue, "projected key", key)', "pass"),
            ('_require_finite(NonFiniteKeyValue, "projected value", value)', "pass"),
            ('_require_finite(NonFiniteAttention, "rotated query", query)', "pass"),
            ("    _require_finite_scores(scores, positions, stored_positions, key_positions_new, window, sinks)\n", ""),
            ('_require_finite(NonFiniteAttention, "attention output", output)', "pass")),
           "no finiteness checks at all: NaN rows are committed"),
    Mutant("output_checked_after_commit", "attention.py",
           (('            _require_finite(NonFiniteAttention, "rotated query", query)\n', ""),
            # a non-finite query makes its own score non-finite: the score check would stand in for it
            ("    _require_finite_scores(scores, positions, stored_positions, key_positions_new, window, sinks)\n", ""),
            ('            _require_finite(NonFiniteAttention, "attention output", output)\n', ""),
            ("        self._validate_request(x, cache)\n        prepared = self.prepare(x, cache)\n"
             "        cache.commit(prepared.keys, prepared.values)\n        return prepared.output",
             "        self._validate_request(x, cache)\n        prepared = self.prepare(x, cache)\n"
             "        cache.commit(prepared.keys, prepared.values)\n"
             '        _require_finite(NonFiniteAttention, "attention output", prepared.output)\n'
             "        return prepared.output")),
           "commits the row before checking that the query, its scores and the output are finite"),
    Mutant("integer_input_cast", "attention.py",
           (("        self._validate_request(x, cache)\n",
             "        x = np.asarray(x).real.astype(np.float64)\n        self._validate_request(x, cache)\n"),),
           "silently converts integer and complex rows to float64"),
    # -- the decode session and the prefix store (docs/spec.md §9-10) --
    Mutant("stale_next_position", "prefix_store.py",
           (("return _continue(model, ids, entry, cut, cut, scope, signature, index)",
             "return _continue(model, ids, entry, cut, entry.next_position if entry else cut, scope, signature, "
             "index)"),),
           "trims K/V and positions to the cut but resumes at the entry's old next_position (the seed's control)",
           "prefix store"),
    Mutant("equal_ids_after_difference_reused", "prefix_store.py",
           (("        if x != y:\n            break\n", "        if x != y:\n            continue\n"),),
           "counts equal ids after the first difference as common prefix", "prefix store"),
    Mutant("sliding_window_partial_reuse", "prefix_store.py",
           (("if entry.windowed and not (common == len(entry.tokens) < len(tokens)):", "if False:"),),
           "reuses part of a sliding-window entry whose early rows are gone", "prefix store"),
    Mutant("scope_ignored", "prefix_store.py",
           (("if entry.scope != scope or entry.signature != signature:", "if entry.signature != signature:"),),
           "reuses entries of another scope", "prefix store"),
    Mutant("weights_ignored_in_signature", "prefix_store.py",
           (("        digest.update(np.ascontiguousarray(parameter.value).tobytes())\n", ""),),
           "the signature leaves out the weights' values", "prefix store"),
    Mutant("ties_to_the_oldest", "prefix_store.py",
           (("for index in reversed(range(len(self._entries))):", "for index in range(len(self._entries)):"),),
           "hands ties to the oldest entry", "prefix store"),
    Mutant("ties_compared_after_capping", "prefix_store.py",
           (("            if common > longest:\n                best, longest = index, common\n",
             "            if min(common, len(tokens) - 1) > longest:\n"
             "                best, longest = index, min(common, len(tokens) - 1)\n"),),
           "caps each entry's common prefix before comparing: a newer, shorter entry wins a false tie",
           "prefix store"),
    Mutant("integral_float_token_accepted", "decoder.py",
           (("not isinstance(t, (int, np.integer))]", "not isinstance(t, (int, np.integer, float))]"),),
           "accepts 1.0 as token id 1", "prefix store"),
    Mutant("returned_entries_alias_stored_arrays", "prefix_store.py",
           (("return [_copy(entry) for entry in self._entries]", "return list(self._entries)"),),
           "entries() hands out the stored arrays themselves", "prefix store"),
    Mutant("empty_suffix_on_full_hit", "prefix_store.py",
           (("cut = min(longest, len(tokens) - 1)", "cut = longest"),),
           "reuses the whole query, leaving nothing to compute the last logits from", "prefix store"),
    Mutant("evicts_the_newest", "prefix_store.py",
           (("del self._entries[:-self.capacity]", "del self._entries[self.capacity:]"),),
           "a full store drops the new entry instead of the oldest", "prefix store"),
    Mutant("session_commits_block_by_block", "decoder.py",
           (("        for block, cache in zip(self.model.blocks, self.caches):\n"
             "            cache.check_binding(block)  # parameters may have been written in place since creation\n",
             ""),
            ("            rows = block.prepare(hidden, cache)\n",
             "            cache.check_binding(block)\n            rows = block.prepare(hidden, cache)\n"
             "            cache.commit(rows.keys, rows.values)\n"),
            ("        for cache, rows in zip(self.caches, prepared):  # nothing below can fail\n"
             "            cache.commit(rows.keys, rows.values)\n", "")),
           "commits block 1 before block 2 has been checked and computed", "session"),
    # -- the session's order of checks: tokens, then every block's revision, then the capacity --
    Mutant("session_order_per_block", "decoder.py",
           (("            cache.check_binding(block)  # parameters may have been written in place since creation\n"
             "        if self.length + len(tokens) > self.capacity:"
             "  # bindings first, then capacity, as in chapter 37\n"
             "            raise CacheFull(self.capacity)\n",
             "            cache.check_binding(block)  # parameters may have been written in place since creation\n"
             "            if cache.length + len(tokens) > self.capacity:  # each block as a layer: binding, then room\n"
             "                raise CacheFull(self.capacity)\n"),),
           "checks revision and capacity block by block: a full session with a stale later block reports full",
           "session"),
    Mutant("session_binding_before_tokens", "decoder.py",
           (("        return self._advance(validate_tokens(tokens, self.model.vocab))\n",
             "        for block, cache in zip(self.model.blocks, self.caches):\n"
             "            cache.check_binding(block)  # fail fast on a stale session, before reading the prompt\n"
             "        return self._advance(validate_tokens(tokens, self.model.vocab))\n"),),
           "a prefill checks the blocks' revisions before its tokens: stale and invalid reports revision_mismatch",
           "session"),
    Mutant("session_capacity_before_tokens", "decoder.py",
           (("        return self._advance(validate_tokens(tokens, self.model.vocab))\n",
             "        if self.length + len(tokens) > self.capacity:  # an overlong prompt is refused at once\n"
             "            raise CacheFull(self.capacity)\n"
             "        return self._advance(validate_tokens(tokens, self.model.vocab))\n"),),
           "a prefill checks the free capacity before its tokens: full and invalid reports full", "session"),
    # -- non-finite scores: a visible key's score must be finite (a -inf among finite scores weighs 0) --
    Mutant("score_only_overflow_unchecked", "attention.py",
           (("    _require_finite_scores(scores, positions, stored_positions, key_positions_new, window, sinks)\n",
             ""),),
           "no check of the scores: a row whose own score overflows to -inf beside finite ones is committed",
           # a narrow corner: weights that let a score overflow, a row held, then the -inf sign (+inf and a lone
           # -inf make the output non-finite, which another check catches); caught at example 148-197 in tox
           examples=300),
    # -- malformed inputs, one check at a time, in the documented order (dtype first) --
    Mutant("float32_silently_cast", "attention.py",
           (("if not isinstance(x, np.ndarray) or x.dtype != np.float64:",
             "if not isinstance(x, np.ndarray) or x.dtype not in (np.float64, np.float32):"),),
           "accepts float32 rows (computing with them as if float64)"),
    Mutant("list_input_accepted", "attention.py",
           (("        self._validate_request(x, cache)\n        prepared",
             "        if isinstance(x, list):\n            x = np.array(x)\n"
             "        self._validate_request(x, cache)\n        prepared"),),
           "converts a nested Python list to an array instead of rejecting it"),
    Mutant("dtype_checked_late", "attention.py",
           (("        _check_float_rows(x)\n        if x.shape[1] < 1 or (x.shape[1] != 1 and not chunk):",
             "        if np.ndim(x) != 3:\n            raise InputRankError(np.ndim(x))\n"
             "        if np.shape(x)[1] < 1 or (np.shape(x)[1] != 1 and not chunk):"),
            ("        if x.shape[0] != cache.batch_size:", "        if np.shape(x)[0] != cache.batch_size:"),
            ("        if x.shape[2] != self.model_width:\n"
             "            raise InputWidthMismatch(expected=self.model_width, actual=x.shape[2])\n"
             "        cache.check_binding(self)\n",
             "        if np.shape(x)[2] != self.model_width:\n"
             "            raise InputWidthMismatch(expected=self.model_width, actual=np.shape(x)[2])\n"
             "        _check_float_rows(x)\n        cache.check_binding(self)\n")),
           "checks the dtype after rank, token count, batch and width: a float32 row of another width reports width"),
    Mutant("write_then_raise_on_wrong_batch", "attention.py",
           (("        if x.shape[0] != cache.batch_size:\n",
             "        if x.shape[0] != cache.batch_size:\n"
             "            row = np.zeros((cache.batch_size, cache.kv_heads, 1, cache.head_width))\n"
             "            cache.commit(row, row)\n"),),
           "declares no validation at all, and on a wrong batch writes a row before raising",
           undeclared=("input_validation",)),
    Mutant("single_row_broadcast_then_raise", "attention.py",
           (("        if x.shape[0] != cache.batch_size:\n",
             "        if x.shape[0] != cache.batch_size:\n"
             "            if x.shape[0] == 1 and x.shape[1:] == (1, self.model_width):  # broadcast into every row\n"
             "                rows = self.prepare(np.repeat(x, cache.batch_size, axis=0), cache)\n"
             "                cache.commit(rows.keys, rows.values)\n"),),
           "declares no validation, and writes a batch-1 row into every row of a larger batch before raising",
           undeclared=("input_validation",)),
    Mutant("larger_batch_first_rows_then_raise", "attention.py",
           (("        if x.shape[0] != cache.batch_size:\n",
             "        if x.shape[0] != cache.batch_size:\n"
             "            if x.shape[0] > cache.batch_size and x.shape[1:] == (1, self.model_width):\n"
             "                rows = self.prepare(np.ascontiguousarray(x[:cache.batch_size]), cache)\n"
             "                cache.commit(rows.keys, rows.values)\n"),),
           "declares no validation, and writes the first rows of a larger batch before raising",
           undeclared=("input_validation",)),
    # -- two bugs failing one claimed check (batch_mismatch) in two ways, told apart by what they change (#23) --
    Mutant("batch_mismatch_after_the_length_moves", "attention.py",
           (("            raise InputBatchMismatch(cache=cache.batch_size, input=x.shape[0])\n",
             "            if cache.length < cache.capacity:  # the offset moves before a write that then fails\n"
             "                cache._length += 1\n"
             "                cache._next_position += 1\n"
             "            raise InputBatchMismatch(cache=cache.batch_size, input=x.shape[0])\n"),),
           "advances the length before a write of a wrong batch, which then fails: the length changed"),
    Mutant("smaller_batch_broadcast_then_raise", "attention.py",
           (("            raise InputBatchMismatch(cache=cache.batch_size, input=x.shape[0])\n",
             "            if 0 < x.shape[0] < cache.batch_size and cache.length and x.shape[1] == 1:\n"
             "                whole = np.ascontiguousarray(np.broadcast_to(x[:1], (cache.batch_size, *x.shape[1:])))\n"
             "                rows = self.prepare(whole, cache)  # the smaller batch broadcast over every row\n"
             "                cache._keys[:, :, (cache.length - 1) % cache.slots] = rows.keys[:, :, 0]\n"
             "                cache._values[:, :, (cache.length - 1) % cache.slots] = rows.values[:, :, 0]\n"
             "            raise InputBatchMismatch(cache=cache.batch_size, input=x.shape[0])\n"),),
           "broadcasts a smaller batch over the last row held, then raises: the key and value rows changed",
           # a narrow corner: a cache of batch >= 2 holding rows, a one-row batch of one token; its derandomised
           # run met it at example 39 outside pytest and after 100 inside (2026-12-03)
           examples=300),
    Mutant("read_only_input_rejected", "attention.py",
           (("if not isinstance(x, np.ndarray) or x.dtype != np.float64:",
             "if not isinstance(x, np.ndarray) or x.dtype != np.float64 or not x.flags.writeable:"),),
           "rejects a read-only float64 row, which is valid"),
    # -- cache operations (spec §13): chunks, truncation, reorder, forks, sliding windows --
    Mutant("chunk_not_causal", "attention.py",
           (("        np.copyto(own, -np.inf, where=key_positions_new[None, -rows:] > positions[:, None])\n",
             "        pass\n"),),
           "a chunk's rows see the rows after them (no causal mask inside a chunk)", "cache operations"),
    Mutant("chunk_capacity_checked_per_row", "attention.py",
           (("if cache.length + x.shape[1] > cache.capacity:", "if cache.length >= cache.capacity:"),),
           "a chunk is let in while one row is free: its rows past the capacity wrap onto the oldest",
           "cache operations"),
    Mutant("chunk_positions_all_at_length", "attention.py",
           (("positions = np.arange(start, start + x.shape[1])  # [T]", "positions = np.full(x.shape[1], start)"),),
           "rotates every row of a chunk at the cache's length", "cache operations"),
    Mutant("truncate_keeps_next_position", "cache.py",
           (("        self._next_position -= self._length - length\n", ""),),
           "truncation keeps the old next position: rows appended after it are rotated too far", "cache operations"),
    Mutant("truncate_beyond_length_accepted", "cache.py",
           (("or not 0 <= length <= self._length:", "or not 0 <= length:"),),
           "truncate(n) with n above the length is accepted and exposes stale rows", "cache operations"),
    Mutant("truncate_window_revives_evicted", "cache.py",
           (("            if needed < length and self._first_held > needed:", "            if False:"),),
           "a window cache truncates past its oldest held row, as if evicted rows came back", "window cache"),
    # -- sessions over windows: at least the rows the next query sees (docs/spec.md §9.1, #18) --
    Mutant("session_window_state_drops_a_needed_row", "conformance.py",
           (("        return tuple(BlockRows(c.keys()[0], c.values()[0], c.positions()) for c in session.caches)",
             "        cut = 2 if session.model.window is not None else 0  # the oldest two held rows left out\n"
             "        return tuple(BlockRows(c.keys()[0][:, cut:], c.values()[0][:, cut:], c.positions()[cut:])\n"
             "                     for c in session.caches)"),),
           "a windowed session's state leaves out the two oldest rows held: one the next query sees", "session"),
    Mutant("session_window_state_positions_shifted", "conformance.py",
           (("        return tuple(BlockRows(c.keys()[0], c.values()[0], c.positions()) for c in session.caches)",
             "        shift = 1 if session.model.window is not None else 0\n"
             "        return tuple(BlockRows(c.keys()[0], c.values()[0], c.positions() + shift)\n"
             "                     for c in session.caches)"),),
           "a windowed session's state names each held row by the position after its own", "session"),
    # -- attention sinks beside a window (attention_sinks, #18) --
    Mutant("sinks_not_visible", "attention.py",
           (("& (key_positions[None, :] >= sinks)", "& (key_positions[None, :] >= 0)"),),
           "a window cache with sinks masks the sink rows like any row out of the window", "window cache"),
    Mutant("sinks_one_too_many", "attention.py",
           (("& (key_positions[None, :] >= sinks)", "& (key_positions[None, :] > sinks)"),),
           "the first S + 1 positions stay visible, not the first S", "window cache"),
    # -- a window truncating only until it is full (window_truncates_until_full, #18) --
    Mutant("until_full_refuses_one_row_late", "cache.py",
           (("self.truncates_until_full and self._length >= self.window:",
             "self.truncates_until_full and self._length > self.window:"),),
           "declares truncation until the window is full, but truncates once more at exactly W rows",
           "window cache", factory="make_window_until_full_adapter"),
    Mutant("until_full_refuses_after_cutting", "cache.py",
           (("        if self.window is not None and self.truncates_until_full and self._length >= self.window:\n",
             "        if self.window is not None and self.truncates_until_full and self._length >= self.window:\n"
             "            self._length = self._next_position = length\n"),),
           "refuses a truncation of a full window with evicted, after cutting its length (write then raise)",
           "window cache", factory="make_window_until_full_adapter"),
    # -- a windowed session refusing prefills longer than W (prefill_within_window) --
    Mutant("prefill_within_window_refuses_w_tokens", "decoder.py",
           (("if self.prefill_within_window and window is not None and len(tokens) > window:",
             "if self.prefill_within_window and window is not None and len(tokens) >= window:"),),
           "declares it may refuse a prefill of more than W tokens, but refuses one of exactly W", "session",
           factory="make_prefill_within_window_adapter"),
    Mutant("prefill_within_window_refuses_after_writing", "decoder.py",
           (("            raise PrefillLongerThanWindow(len(tokens), window)\n",
             "            self.prefill_within_window = False  # write the prompt, then refuse it\n"
             "            try:\n"
             "                self._advance(tokens)\n"
             "            finally:\n"
             "                self.prefill_within_window = True\n"
             "            raise PrefillLongerThanWindow(len(tokens), window)\n"),),
           "refuses a prefill longer than the window with refused, after committing it (write then raise)",
           "session", factory="make_prefill_within_window_adapter"),
    Mutant("reorder_values_forgotten", "cache.py",
           (("        self._values[...] = self._values[gather]\n", ""),),
           "reorders the keys of the batch but not the values", "cache operations"),
    Mutant("reorder_leaves_the_first_slot", "cache.py",
           (("        self._keys[...] = self._keys[gather]  # fancy indexing copies first: in-place is safe\n"
             "        self._values[...] = self._values[gather]\n",
             "        self._keys[:, :, 1:] = self._keys[gather][:, :, 1:]\n"
             "        self._values[:, :, 1:] = self._values[gather][:, :, 1:]\n"),),
           "a reorder gathers every slot but the first, which stays in the old batch order (a cache that keeps its "
           "first rows apart, a quantized block or a sink, and reorders only the rest: transformers 5.18's "
           "QuantizedLayer, bench/shipped)", "cache operations"),
    Mutant("reorder_negative_index_wraps", "cache.py",
           (("if array.size and (array.min() < 0 or array.max() >= batch_size):",
             "if array.size and array.max() >= batch_size:"),),
           "a negative index wraps around (numpy's indexing) instead of being rejected", "cache operations"),
    Mutant("fork_shares_buffers", "cache.py",
           (("twin._keys, twin._values, twin._positions = self._keys.copy(), self._values.copy(), "
             "self._positions.copy()",
             "twin._keys, twin._values, twin._positions = self._keys, self._values, self._positions"),),
           "a fork aliases the original's buffers: a write to either shows in both", "cache operations"),
    Mutant("fork_shares_values", "cache.py",
           (("twin._keys, twin._values, twin._positions = self._keys.copy(), self._values.copy(), "
             "self._positions.copy()",
             "twin._keys, twin._values, twin._positions = self._keys.copy(), self._values, self._positions.copy()"),),
           "a fork copies the keys but aliases the values", "cache operations"),
    Mutant("window_sees_one_more", "attention.py",
           (("(key_positions[None, :] <= positions[:, None] - window)",
             "(key_positions[None, :] < positions[:, None] - window)"),),
           "a query at q sees keys down to q - W (W + 1 keys): the window boundary off by one", "window cache"),
    Mutant("chunk_window_mask_spares_held_rows", "attention.py",
           (("        hidden = (key_positions[None, :] > positions[:, None]) | outside\n",
             "        if rows > 1:  # a chunk's mask that ignores the rows kept before it\n"
             "            outside[:, :stored] = False\n"
             "        hidden = (key_positions[None, :] > positions[:, None]) | outside\n"),),
           "a chunk's rows see every row the window cache held before the chunk, even those out of their window",
           "window cache"),
    Mutant("window_rows_in_ring_order", "cache.py",
           (("        keys: np.ndarray = self._keys[:, :, self._held_slots()]",
             "        keys: np.ndarray = self._keys[:, :, np.sort(self._held_slots())]"),),
           "a wrapped window shows its key rows in slot order, not oldest first", "window cache"),
    # -- quantized storage (spec §13.6): each through an adapter declaring its storage --
    Mutant("storage_read_back_without_scale", "storage.py",
           (("return scaled.astype(_float_type(self.format)).astype(np.float64) * scale",
             "return scaled.astype(_float_type(self.format)).astype(np.float64)"),),
           "fp8 rows are read back without multiplying by their scale", factory="make_fp8_adapter"),
    Mutant("storage_per_channel_scale_taken_per_tensor", "storage.py",
           (("axis=(0, 1, 2, 3) if self.scale == \"per_tensor\" else (0, 2)", "axis=(0, 1, 2, 3)"),),
           "declares int8 with a per-channel scale, but scales the whole tensor at once",
           factory="make_int8_adapter"),
    Mutant("storage_float16_rounded_as_bfloat16", "storage.py",
           (('"float16": np.float16,', '"float16": ml_dtypes.bfloat16,'),),
           "declares float16 storage, but rounds to bfloat16 (3 bits fewer)", factory="make_float16_adapter"),
    Mutant("storage_zero_calibration_scale_tiny", "storage.py",
           (("        return np.where(amax > 0, amax / self.largest, 1.0)",
             "        return np.maximum(amax / self.largest, np.finfo(np.float32).tiny)"),),
           "a frozen scale calibrated on an all-zero update is float32's smallest normal: later rows read back 0",
           factory="make_fp8_adapter"),
    Mutant("affine_one_scale_per_token", "storage.py",
           (("low = grouped.min(axis=-1, keepdims=True, initial=np.inf)",
             "low = grouped.min(axis=(-2, -1), keepdims=True, initial=np.inf)"),
            ("step = np.maximum((grouped.max(axis=-1, keepdims=True, initial=-np.inf) - low)",
             "step = np.maximum((grouped.max(axis=(-2, -1), keepdims=True, initial=-np.inf) - low)")),
           "declares affine groups of 4 features, but takes one minimum and step over the whole head",
           factory="make_uint4_group_adapter"),
    Mutant("affine_groups_strided", "storage.py",
           (("grouped = rows.reshape(*rows.shape[:-1], rows.shape[-1] // self.group, self.group)\n"
             "        low =",
             "grouped = np.swapaxes(rows.reshape(*rows.shape[:-1], self.group, rows.shape[-1] // self.group), -1, -2)\n"
             "        low ="),
            (".reshape(rows.shape)\n", ".swapaxes(-1, -2).reshape(rows.shape)\n")),
           "groups every (dh / g)-th feature together, as a reshape along the wrong axis does, not g in a row",
           factory="make_uint4_group_adapter"),
    # -- batch-size operations (select, repeat_interleave) --
    Mutant("repeat_interleave_tiles", "cache.py",
           (("self._regather(np.repeat(np.arange(self.batch_size), int(repeats)))",
             "self._regather(np.tile(np.arange(self.batch_size), int(repeats)))"),),
           "repeats the whole batch (np.tile) instead of each row in a row (torch.repeat_interleave)",
           "cache operations"),
    Mutant("select_negative_index_wraps", "cache.py",
           (("    if array.min() < 0 or array.max() >= batch_size:\n"
              "        raise InvalidIndices(f\"{array.tolist()} has an index outside [0, {batch_size})\")\n"
              "    return array\n",
             "    if array.max() >= batch_size:\n"
              "        raise InvalidIndices(f\"{array.tolist()} has an index outside [0, {batch_size})\")\n"
              "    return array\n"),),
           "a selection's negative index wraps around, as numpy's indexing does", "cache operations"),
    Mutant("select_keeps_the_old_scale", "cache.py",
           (("        self._keys, self._values, self.batch_size = keys, values, len(gather)\n"
              "        if self.storage is not None:\n            self._store(recompute=True)\n",
             "        self._keys, self._values, self.batch_size = keys, values, len(gather)\n"),),
           "after a select or repeat, a recomputed scale is not recomputed from the rows still held",
           "cache operations", factory="make_int8_adapter"),
    # -- paged caches (#10) --
    Mutant("paged_hash_without_parent", "paged_cache.py",
           (("            digest = hashlib.sha256(parent)\n", "            digest = hashlib.sha256()\n"),),
           "a block's hash leaves out its parent: equal blocks after different prefixes are shared", "paged"),
    Mutant("paged_hash_without_scope", "paged_cache.py",
           (('for key, value in (("scope", scope), ("signature", signature))',
             'for key, value in (("signature", signature),)'),),
           "the block hash leaves out the scope although the policy declares it: scopes share blocks", "paged"),
    Mutant("paged_request_keys_untagged", "paged_cache.py",
           (('extra += b"".join(f"{key}={value}\\0".encode() for key, value in request if value)',
             'extra += b"".join(f"{value}\\0".encode() for key, value in request if value)'),),
           "request keys hashed as bare values: a LoRA adapter named X and a salt X are one key (vLLM #44701)",
           "paged", factory="make_request_keys_paged_adapter"),
    Mutant("paged_salt_not_hashed", "paged_cache.py",
           (('for key, value in request if value)', 'for key, value in request if value and key != "salt")'),),
           "the salt is left out of the block hash: requests of other salts share blocks", "paged",
           factory="make_request_keys_paged_adapter"),
    Mutant("paged_evicting_a_copy_unregisters_all", "paged_cache.py",
           (("        self._block_of[digest].remove(block)\n        if not self._block_of[digest]:\n"
             "            del self._block_of[digest]\n",
             "        for other in self._block_of.pop(digest):\n            self._hash_of.pop(other, None)\n"),),
           "evicting one registered copy unregisters every copy of its content: the others are no longer hit",
           "paged", factory="make_registered_duplicates_paged_adapter"),
    Mutant("paged_duplicates_left_unregistered", "paged_cache.py",
           (('(self.duplicates == "registered" or digest not in self._block_of)', '(digest not in self._block_of)'),),
           "declares registered duplicates but keeps them private: freed, they are not cached", "paged",
           factory="make_registered_duplicates_paged_adapter"),
    Mutant("paged_signature_without_weights", "paged_cache.py",
           (("        signature = computation_signature(model)\n",
             "        signature = repr((model.positions, model.window, Geometry.of(model)))\n"),),
           "the computation signature leaves out the weights: rows of other or older weights are reused", "paged"),
    Mutant("paged_partial_block_registered", "paged_cache.py",
           (("        full = len(held.tokens) // self.block_size\n        chain = ",
             "        full = -(-len(held.tokens) // self.block_size)\n        chain = "),),
           "registers the partial last block for sharing, as if it were full", "paged"),
    Mutant("paged_copy_on_write_missing", "paged_cache.py",
           (("        return index if self._references[block] > 1 or block in self._hash_of else None\n",
             "        return None\n"),),
           "an append writes into a shared or registered block instead of copying it first", "paged"),
    Mutant("paged_reference_leaked_on_free", "paged_cache.py",
           (("        del self._sequences[sequence]\n        self._release_all(held.table)\n",
             "        del self._sequences[sequence]\n        self._release_all(held.table[1:])\n"),),
           "free releases every block but the first: its reference count never drops", "paged"),
    Mutant("paged_referenced_block_evicted", "paged_cache.py",
           (("list(self._cached)[:count - len(self._free)]", "list(self._hash_of)[:count - len(self._free)]"),
            ("                del self._cached[block]\n", "                self._cached.pop(block, None)\n")),
           "eviction takes the oldest registered blocks, referenced or not", "paged"),
    Mutant("paged_last_token_not_recomputed", "paged_cache.py",
           (("limit = (len(tokens) - 1) // self.block_size  # the last token is always recomputed",
             "limit = len(tokens) // self.block_size"),),
           "a full hit reuses every block: no token is left to compute the last logits from", "paged"),
    Mutant("paged_eagle_drop_as_a_cap", "paged_cache.py",
           (("recomputes the last matched block\n            return hit[:-1]\n",
             "recomputes the last matched block\n"
             "            return hit[:max(0, (len(tokens) - 1) // self.block_size - 1)]\n"),),
           "drops one block from the cap, not from the run matched: a shorter run is reused whole", "paged",
           factory="make_eagle_paged_adapter", examples=200),  # only where the run matched is shorter than the cap
    Mutant("paged_eagle_drops_two", "paged_cache.py",
           (("            return hit[:-1]\n", "            return hit[:-2]\n"),),
           "drops the last two matched blocks", "paged", factory="make_eagle_paged_adapter"),
    Mutant("paged_fork_aliases_partial_block", "paged_cache.py",
           (("        full = len(held.tokens) // self.block_size\n        needed = len(held.table) - full\n",
             "        full = len(held.table)\n        needed = 0\n"),),
           "a fork shares the parent's partial block, which both then write into", "paged"),
    Mutant("paged_re_add_fork_in_another_scope", "paged_cache.py",
           (("return self.add(held.model, held.scope, held.tokens, dict(held.keys)).sequence",
             "return self.add(held.model, held.scope + '*', held.tokens, dict(held.keys)).sequence"),),
           "a re-adding fork adds the parent's tokens in another scope: it reuses none of the parent's blocks",
           "paged", factory="make_re_add_fork_adapter"),
    Mutant("paged_re_add_fork_drops_the_last_token", "paged_cache.py",
           (("return self.add(held.model, held.scope, held.tokens, dict(held.keys)).sequence",
             "return self.add(held.model, held.scope, held.tokens[:-1] or held.tokens, dict(held.keys)).sequence"),),
           "a re-adding fork adds all but the parent's last token", "paged", factory="make_re_add_fork_adapter"),
    Mutant("paged_copy_on_write_without_rows", "paged_cache.py",
           (("        copy = self._copy_of(block)\n        self._release_all([block])\n",
             "        (copy,) = self._take(1)  # a fresh block: its rows are whatever it held\n"
             "        self._release_all([block])\n"),),
           "copy-on-write takes a fresh block without copying the shared block's rows into it", "paged"),
    # -- paged declarations: hits of cached copies, node eviction, opaque block ids (#23) --
    Mutant("paged_cached_first_takes_the_first_copy", "paged_cache.py",
           (("            hit.append((cached or blocks)[0])\n", "            hit.append(blocks[0])\n"),),
           "declares hit_copy cached_first, but a hit takes the first registered copy, in use or not", "paged",
           factory="make_cached_first_paged_adapter"),
    Mutant("paged_cached_first_falls_back_to_referenced_copies", "paged_cache.py",
           (("        hit = self._longest_hit(ids, scope, signature, request)\n",
             "        hit = self._longest_hit(ids, scope, signature, request)\n"
             "        if self._blocks_for(len(ids)) - len(hit) > len(self._free) + sum(\n"
             "                b not in hit for b in self._cached):  # short with the cached copies: the first ones\n"
             "            hit = [self._block_of[self._hash_of[b]][0] for b in hit]\n"),),
           "declares hit_copy cached_first, but where the cached copies leave too little room it takes in-use copies "
           "and goes ahead instead of raising full", "paged", factory="make_cached_first_paged_adapter"),
    Mutant("paged_lru_nodes_evicts_past_the_shortfall", "paged_cache.py",
           (("            if len(victims) >= shortfall:\n", "            if len(victims) > shortfall:\n"),),
           "declares lru_nodes, but evicts one node more whenever the nodes evicted meet the shortfall exactly",
           "paged", factory="make_node_lru_paged_adapter"),
    Mutant("paged_lru_nodes_newest_first", "paged_cache.py",
           (("        for node in dict.fromkeys(self._cached.values()):  # nodes, oldest first\n",
             "        for node in reversed(list(dict.fromkeys(self._cached.values()))):\n"),),
           "declares lru_nodes, but evicts the most recently cached node first", "paged",
           factory="make_node_lru_paged_adapter"),
    Mutant("paged_padding_page_handed_out", "paged_cache.py",
           (("        self._free = list(range(pages - 1, first - 1, -1))",
             "        self._free = list(range(num_blocks - 1, -1, -1))"),),
           "numbers its blocks 0..n-1 although page 0 is padding: the sequence given page 0 has its rows overwritten "
           "by every padded write", "paged", factory="make_padding_page_paged_adapter"),
    Mutant("paged_padding_page_counts_one_short", "paged_cache.py",
           (("        self._references = np.zeros(pages, dtype=np.int64)\n",
             "        self._references = np.zeros(num_blocks, dtype=np.int64)\n"),),
           "sizes the reference counts by the block count, as if ids were 0..n-1: counting the last page raises, "
           "after the block was taken", "paged", factory="make_padding_page_paged_adapter"),
    Mutant("transcendentals_exp_in_float16", "functions.py",
           (("        return self._of(np.exp, x)\n", "        return Functions(\"float16\")._of(np.exp, x)\n"),),
           "declares exp, cos and sin of float32 accuracy; its exp has float16's",
           factory="make_float32_transcendentals_adapter", examples=200),  # seen only past 8 float32 ulps
    Mutant("transcendentals_angles_to_float16", "functions.py",
           (("        return self._of(np.cos, x)\n", "        return self._of(np.cos, x).astype(np.float16) * 1.0\n"),
            ("        return self._of(np.sin, x)\n", "        return self._of(np.sin, x).astype(np.float16) * 1.0\n")),
           "declares float32 transcendentals; its RoPE cos and sin come out rounded to float16",
           factory="make_float32_transcendentals_adapter", examples=200),  # a rotated row past position 0
    Mutant("paged_lru_evicts_everything", "paged_cache.py",
           (('victims = list(self._cached) if self.eviction == "all_at_once" else',
             "victims = list(self._cached) if True else"),),
           "declares LRU eviction, but evicts every cached block when short", "paged"),
    # -- a window with sinks full at W + S rows (window_full_counts_sinks, #23) --
    Mutant("sinks_ring_full_at_the_window", "cache.py",
           (("self.full_counts_sinks and self._length >= self.window + self.sinks:",
             "self.full_counts_sinks and self._length >= self.window:"),),
           "declares a ring of W + S slots, but refuses truncation from W rows on: the sinks are not counted",
           "window cache", factory="make_sinks_ring_adapter"),
    Mutant("sinks_ring_refuses_one_row_late", "cache.py",
           (("self.full_counts_sinks and self._length >= self.window + self.sinks:",
             "self.full_counts_sinks and self._length > self.window + self.sinks:"),),
           "declares a ring of W + S slots, but truncates once more at exactly W + S rows",
           "window cache", factory="make_sinks_ring_adapter"),
    # -- affine groups with the zero point on a level (storage zero_point: level, #23) --
    Mutant("zero_point_range_not_widened", "storage.py",
           (("low = np.minimum(grouped.min(axis=-1, keepdims=True, initial=np.inf), 0.0)",
             "low = grouped.min(axis=-1, keepdims=True, initial=np.inf)"),
            ("high = np.maximum(grouped.max(axis=-1, keepdims=True, initial=-np.inf), 0.0)",
             "high = grouped.max(axis=-1, keepdims=True, initial=-np.inf)")),
           "puts the zero point on a level without widening the range to hold 0: a group of one sign is clipped",
           factory="make_uint4_zero_point_adapter"),
    Mutant("zero_point_step_over_two_to_the_bits", "storage.py",
           (("step = np.maximum((high - low) / levels, self.min_step)",
             "step = np.maximum((high - low) / (levels + 1), self.min_step)"),),
           "divides the range by 2**bits, not 2**bits - 1: the grid is a step short, and the far end clipped",
           factory="make_uint4_zero_point_adapter"),
    # -- affine groups with the larger extreme exact and 0 on a level (storage zero_point: extreme, mlx, #36) --
    Mutant("extreme_always_the_minimum", "storage.py",
           (("from_min = np.abs(w_min) > np.abs(w_max)", "from_min = np.abs(w_min) >= 0"),),
           "keeps the minimum exact whatever the magnitudes: in a group mostly above 0 the step is the minimum's "
           "distance from 0 over a whole number, and the far end is clipped by several steps",
           factory="make_uint4_extreme_adapter"),
    Mutant("extreme_scale_sign_dropped", "storage.py",
           (("scale = np.where(from_min, scale, -scale)  # counted from the maximum, the steps go down",
             "scale = np.where(from_min, scale, scale)"),),
           "drops the scale's sign when counting from the maximum: the grid runs up from it, and every other value "
           "of the group reads back as the maximum",
           factory="make_uint4_extreme_adapter"),
    # -- a preallocated buffer without a full check (an accepted call keeps the rows held before it, #23) --
    Mutant("unchecked_write_clamped_to_the_last_row", "cache.py",
           (('            raise IndexError(f"rows {start} .. {start + tokens - 1} are past a buffer of '
             '{self.slots} rows")',
             "            start = self.slots - tokens  # clamped so that the write fits (dynamic_update_slice)"),),
           "a step past the capacity is written at C - 1, over the last row held, and accepted",
           factory="make_unchecked_capacity_adapter"),
    Mutant("unchecked_write_wraps_to_the_first_row", "cache.py",
           (('            raise IndexError(f"rows {start} .. {start + tokens - 1} are past a buffer of '
             '{self.slots} rows")',
             "            pass  # the slot index wraps around: row 0 is overwritten"),),
           "a step past the capacity is written into slot C % C = 0, over the first row held, and accepted",
           factory="make_unchecked_capacity_adapter"),
    # -- hard cases on purpose, under the reference's full declaration (#23 item 3) --
    Mutant("paged_request_keys_untagged_under_a_hit_limit", "paged_cache.py",
           (('extra += b"".join(f"{key}={value}\\0".encode() for key, value in request if value)',
             'extra += b"".join(f"{value}\\0".encode() for key, value in request if value)'),),
           "request keys hashed as bare values, in a pool whose hits drop the last matched block: the two-block "
           "prompts of the request-key rule never reach a hit", "paged", factory="make_full_declaration_adapter"),
    Mutant("paged_evicting_a_copy_unregisters_all_under_a_hit_limit", "paged_cache.py",
           (("        self._block_of[digest].remove(block)\n        if not self._block_of[digest]:\n"
             "            del self._block_of[digest]\n",
             "        for other in self._block_of.pop(digest):\n            self._hash_of.pop(other, None)\n"),),
           "evicting one registered copy unregisters every copy, in a pool whose hits drop the last matched block",
           "paged", factory="make_full_declaration_adapter"),
    Mutant("paged_hit_on_an_evicted_duplicate", "paged_cache.py",
           (("        self._block_of[digest].remove(block)\n        if not self._block_of[digest]:\n"
             "            del self._block_of[digest]\n",
             "        if len(self._block_of[digest]) == 1:\n            del self._block_of[digest]\n"),),
           "an evicted copy of a duplicated content stays registered beside the others: a hit may take it, "
           "whatever it holds now", "paged", factory="make_full_declaration_adapter"),
    Mutant("paged_append_filled_block_hashed_without_keys", "paged_cache.py",
           (("        self._write(held, start, computed)\n        self._register(held, start)\n        logits",
             "        self._write(held, start, computed)\n        keys, held.keys = held.keys, ()\n"
             "        self._register(held, start)\n        held.keys = keys\n        logits"),),
           "a block that an append fills is hashed without the sequence's request keys", "paged",
           factory="make_full_declaration_adapter"),
    Mutant("select_keeps_the_leading_rows", "cache.py",
           (("        self._regather(_selection_indices(indices, self.batch_size))\n",
             "        self._regather(np.arange(len(_selection_indices(indices, self.batch_size))))\n"),),
           "a select keeps the first k rows, whichever k rows were selected", "cache operations",
           factory="make_full_declaration_adapter"),
    Mutant("truncate_rebinds_the_cache", "cache.py",
           (("        self._first_held = min(self._first_held, length)\n",
             "        self._first_held = min(self._first_held, length)\n"
             "        self._versions = tuple(p.version for p in self._parameters)\n"),),
           "a truncation binds the cache anew to its layer's parameter versions: a stale cache, cut, is taken back",
           "cache operations", factory="make_full_declaration_adapter"),
    Mutant("reorder_along_the_head_axis", "cache.py",
           (("        self._keys[...] = self._keys[gather]  # fancy indexing copies first: in-place is safe\n"
             "        self._values[...] = self._values[gather]\n",
             "        axis = 1 if self.batch_size == self.kv_heads else 0\n"
             "        self._keys[...] = np.take(self._keys, gather, axis=axis)\n"
             "        self._values[...] = np.take(self._values, gather, axis=axis)\n"),),
           "a reorder gathers along the kv-head axis where the batch size equals the kv heads", "cache operations",
           factory="make_full_declaration_adapter"),
)


# Ragged batches, merged and split (docs/spec.md §13.8; issue 38): two mutants per behaviour, killed by the batches
# machine behind the default reference. The first of each pair is a shipped bug's kind (the issue's).
BATCH_MUTANTS = (
    Mutant("ragged_padding_mask_not_broadcast_over_groups", "attention.py",
           (("    mask = visible[:, None, None]  # [B, 1, 1, T, K]", "    mask = visible[:, None]  # [B, 1, T, K]"),),
           "applies the per-row padding mask unchanged to the grouped queries [B, KV, G, T, K]: a batch of two rows or "
           "more fails to broadcast, or masks each kv head by another row's padding", "batches"),
    Mutant("ragged_padding_keys_visible", "attention.py",
           (("            visible = key_real[:, None, :] & (key_positions", "            visible = (key_positions"),),
           "attends to the padding slots before a row's tokens (their positions are below the query's)", "batches"),
    Mutant("ragged_positions_from_the_padded_column", "attention.py",
           (("        positions = cache.lengths[:, None] + np.arange(tokens)[None, :] - (tokens - counts)[:, None]",
             "        positions = np.broadcast_to(cache.width + np.arange(tokens)[None, :], (len(counts), tokens))"),),
           "rotates a row's new tokens at their padded column, not at the row's own positions", "batches"),
    Mutant("ragged_positions_restart_at_every_chunk", "attention.py",
           (("        positions = cache.lengths[:, None] + np.arange(tokens)[None, :] - (tokens - counts)[:, None]",
             "        positions = np.arange(tokens)[None, :] - (tokens - counts)[:, None] + 0 * cache.lengths[:, None]"
             ),),
           "numbers every chunk's tokens from 0, whatever the row holds", "batches"),
    Mutant("merge_pads_an_empty_side_with_the_other_batch", "cache.py",
           (("        parts = [side._left_padded(width) for side in (self, other)]",
             "        parts = [side._left_padded(width) if side.width else (np.zeros((\n"
             "            (other if side is self else self).batch_size, self.kv_heads, width, self.head_width)),) * 2\n"
             "            for side in (self, other)]"),),
           "a side of a merge that holds no token is padded with the other batch's size: a batch of the wrong size",
           "batches"),
    Mutant("merge_pads_the_shorter_side_on_the_right", "cache.py",
           (("        pad = ((0, 0), (0, 0), (width - self.width, 0), (0, 0))",
             "        pad = ((0, 0), (0, 0), (0, width - self.width), (0, 0))"),),
           "a merge pads the shorter batch after its tokens instead of before: its rows read padding as tokens",
           "batches"),
    Mutant("extract_removes_the_row", "cache.py",
           (("        single._gather(np.array([int(row)]))\n",
             "        single._gather(np.array([int(row)]))\n"
             "        self._gather(np.delete(np.arange(self.batch_size), int(row)))\n"),),
           "extracting a row also removes it from the batch", "batches"),
    Mutant("extract_keeps_the_batch_padding", "cache.py",
           (("        single._gather(np.array([int(row)]))\n",
             "        single._set(self._keys[[int(row)]], self._values[[int(row)]], np.array([self.width]))\n"),),
           "the row extracted keeps the batch's width: a shorter row shows padding as tokens", "batches"),
    Mutant("filter_to_none_breaks", "cache.py",
           (("        width = int(lengths.max(initial=0))", "        width = int(lengths.max())"),),
           "a filter to no rows raises (the longest of no rows)", "batches"),
    Mutant("filter_ignores_the_order", "cache.py",
           (("        self._gather(array)\n", "        self._gather(np.sort(array))\n"),),
           "a filter keeps the rows asked for in their old order, not the order given", "batches"),
    Mutant("ragged_truncate_counts_from_the_padding", "cache.py",
           (("        rank = np.arange(self.width)[None, :] - (self.width - self.lengths)[:, None]"
             "  # a token's position",
             "        rank = np.arange(self.width)[None, :] + 0 * self.lengths[:, None]"),),
           "a truncation of ragged rows keeps the first n slots of the padded layout, not each row's first n tokens",
           "batches"),
    Mutant("ragged_gather_keeps_the_leading_rows_lengths", "cache.py",
           (("        self._relayout(self._keys[rows], self._values[rows], self._real()[rows])",
             "        real = self._real()\n"
             "        self._relayout(self._keys[rows], self._values[rows], real[:len(rows)] if len(rows) <= len(real)\n"
             "                       else real[rows])"),),
           "a select or filter of ragged rows keeps the lengths of the leading rows, not of the rows kept", "batches"),
)
# The second slice (issue 38 item 1): an append past a row's room, a ragged cache's creation checks, merges of batches
# bound elsewhere, and reorder and fork of ragged rows (docs/spec.md §13.8).
BATCH_MUTANTS += (
    Mutant("ragged_full_only_when_a_row_is_full", "attention.py",
           (("        if int((cache.lengths + counts).max(initial=0)) > cache.capacity:",
             "        if int(cache.lengths.max(initial=0)) >= cache.capacity:"),),
           "a ragged chunk is FULL only where some row is already full: a chunk carrying a row past its room is "
           "written", "batches"),
    Mutant("ragged_full_checks_the_shortest_row", "attention.py",
           (("        if int((cache.lengths + counts).max(initial=0)) > cache.capacity:",
             "        if int((cache.lengths + counts).min(initial=0)) > cache.capacity:"),),
           "the room of a ragged chunk is checked on its shortest row only", "batches"),
    Mutant("ragged_creation_takes_zero_rows", "cache.py",
           (("        if batch_size == 0:\n            raise ZeroBatchSize()\n        if capacity == 0:\n"
             "            raise ZeroCapacity()\n        self._binding = LayerKvCache(layer, 1, 1)",
             "        if capacity == 0:\n            raise ZeroCapacity()\n"
             "        self._binding = LayerKvCache(layer, 1, 1)"),),
           "creating a ragged cache of no rows succeeds (§4.2: zero_batch)", "batches"),
    Mutant("ragged_creation_past_the_positions", "cache.py",
           (("        if capacity > layer.rope.max_positions:\n            raise CapacityExceedsPositions(capacity, "
             "layer.rope.max_positions)\n        if storage is not None",
             "        if storage is not None"),),
           "a ragged cache takes a capacity above the RoPE positions", "batches"),
    Mutant("merge_skips_the_binding_check", "cache.py",
           (("        self._binding.check_binding_of(other._binding)\n", ""),),
           "merges a batch bound to another layer (recreated, another RoPE, other versions)", "batches"),
    Mutant("merge_skips_the_geometry_check", "cache.py",
           (("            if mine != theirs:\n                raise error(layer=theirs, cache=mine)\n",
             "            pass\n"),),
           "a merge of a batch of another geometry is refused as a layer mismatch, its geometry never compared",
           "batches"),
    Mutant("merge_compares_only_the_kv_rows", "cache.py",
           (("        for error, mine, theirs in ((CacheModelWidthMismatch, self.model_width, other.model_width),\n"
             "                                    (CacheHeadCountMismatch, self.heads, other.heads),\n"
             "                                    (CacheKvHeadCountMismatch",
             "        for error, mine, theirs in ((CacheKvHeadCountMismatch"),),
           "a merge compares the kv heads and head width only: another model width or head count passes it",
           "batches"),
    Mutant("ragged_reorder_wraps_a_listed_negative_index", "cache.py",
           (("        self._gather(_batch_indices(indices, self.batch_size))\n",
             "        if isinstance(indices, list):  # numpy's wrap, where only an array is checked\n"
             "            indices = [i % self.batch_size if type(i) is int and i < 0 else i for i in indices]\n"
             "        self._gather(_batch_indices(indices, self.batch_size))\n"),),
           "a ragged reorder takes a negative index handed in a list as a row counted from the end", "batches"),
    Mutant("extract_shares_the_row_length", "cache.py",
           (("        single._gather(np.array([int(row)]))\n",
             "        single._gather(np.array([int(row)]))\n"
             "        single.lengths = self.lengths[int(row):int(row) + 1]  # a view: one counter for both\n"),
            ("        self._set(self._keys[:, :, :0], self._values[:, :, :0], "
             "np.zeros(self.batch_size, dtype=np.int64))",
             "        self.lengths[:] = 0  # in place\n"
             "        self._set(self._keys[:, :, :0], self._values[:, :, :0], self.lengths)")),
           "an extracted row shares its length with its batch's row: a reset of either empties the other", "batches"),
    Mutant("merge_checks_the_binding_after_appending", "cache.py",
           (("        self._binding.check_binding_of(other._binding)\n        width = max(self.width, other.width)\n",
             "        width = max(self.width, other.width)\n"),
            ("        self.capacity = max(self.capacity, other.capacity)\n",
             "        self.capacity = max(self.capacity, other.capacity)\n"
             "        self._binding.check_binding_of(other._binding)\n")),
           "a merge of a batch bound elsewhere appends its rows, then raises", "batches"),
    Mutant("ragged_reorder_keeps_the_lengths", "cache.py",
           (("        self._gather(_batch_indices(indices, self.batch_size))\n",
             "        rows = _batch_indices(indices, self.batch_size)\n"
             "        self._relayout(self._keys[rows], self._values[rows], self._real())\n"),),
           "a reorder of ragged rows moves their slots but keeps each place's old length", "batches"),
    Mutant("ragged_reorder_sorts_the_indices", "cache.py",
           (("        self._gather(_batch_indices(indices, self.batch_size))\n",
             "        self._gather(np.sort(_batch_indices(indices, self.batch_size)))\n"),),
           "a reorder of ragged rows takes the rows asked for in their old order", "batches"),
    Mutant("ragged_fork_is_the_same_batch", "cache.py",
           (("        twin = copy.copy(self)\n        twin._set(self._keys.copy(), self._values.copy(), "
             "self.lengths.copy())\n        return twin\n",
             "        return self\n"),),
           "a fork of a ragged batch is the batch itself: a write to either shows in the other", "batches"),
    Mutant("ragged_fork_loses_the_lengths", "cache.py",
           (("        twin._set(self._keys.copy(), self._values.copy(), self.lengths.copy())",
             "        twin._set(self._keys.copy(), self._values.copy(), np.full_like(self.lengths, self.width))"),),
           "a fork of a ragged batch holds every row at the longest row's length: padding read as tokens", "batches"),
)
# Quantized storage on ragged rows (docs/spec.md §13.8): each token's own groups, behind the uint4 reference.
_ROUNDED = ("            keys, values = (self.storage.round(rows, self.storage.scale_for(rows)) "
            "for rows in (keys, values))\n")
BATCH_MUTANTS += (
    Mutant("ragged_storage_scaled_over_the_batch", "cache.py",
           ((_ROUNDED, "            from .storage import StorageRule\n"
                       "            batch = StorageRule(\"int4\", \"per_tensor\")\n"
                       "            keys, values = (batch.round(rows, batch.scale_for(rows)) "
                       "for rows in (keys, values))\n"),),
           "a ragged chunk is stored at one scale over the whole batch, padding included, not in each token's own "
           "groups", "batches", factory="make_uint4_group_adapter"),
    Mutant("ragged_storage_in_a_coarser_format", "cache.py",
           ((_ROUNDED, "            coarse = type(self.storage)(\"uint2\", \"per_group\", group=self.storage.group)\n"
                       "            keys, values = (coarse.round(rows, coarse.scale_for(rows)) "
                       "for rows in (keys, values))\n"),),
           "ragged rows are stored in 2 bits a group where 4 are declared", "batches",
           factory="make_uint4_group_adapter"),
)
# Ragged rows under a sliding window (docs/spec.md §13.8): each row's window in its own positions.
_WINDOW = ("            if cache.window is not None:  # and within the row's own window, counted in its own positions\n"
           "                visible &= key_positions[:, None, :] > positions[:, :, None] - cache.window\n")
BATCH_MUTANTS += (
    Mutant("ragged_window_ignored", "attention.py", ((_WINDOW, ""),),
           "a ragged batch's rows attend to every token they hold, whatever the window", "batches"),
    Mutant("ragged_window_counted_in_padded_columns", "attention.py",
           ((_WINDOW, "            if cache.window is not None:\n"
                      "                columns = np.arange(key_positions.shape[1])\n"
                      "                visible &= columns[None, None, :] > (width + np.arange(tokens))[None, :, None]"
                      " - cache.window\n"),),
           "a ragged row's window is counted in the padded layout's columns, not in its own positions: a row "
           "padded in a chunk sees fewer of its tokens", "batches"),
)
# Ragged truncation by columns (docs/spec.md §13.8, ragged_truncate = "columns"), behind the reference declaring it.
_COLUMNS = "            kept = np.arange(self.width)[None, :] < int(length)\n"
BATCH_MUTANTS += (
    Mutant("ragged_columns_truncate_per_row", "conformance.py",
           (('        return RaggedKvCache(layer, batch_size, capacity, window=window, truncation="columns")',
             '        return RaggedKvCache(layer, batch_size, capacity, window=window, truncation="per_row")'),),
           "a cache declaring ragged_truncate columns cuts each row to its first n tokens instead", "batches",
           factory="make_columns_truncate_adapter"),
    Mutant("ragged_columns_truncate_off_by_one", "cache.py",
           ((_COLUMNS, "            kept = np.arange(self.width)[None, :] <= int(length)\n"),),
           "a truncation by columns keeps one column more than n: every row cut keeps one token too many", "batches",
           factory="make_columns_truncate_adapter"),
)
MUTANTS = MUTANTS + BATCH_MUTANTS


# The caches of a model's layers, operated at once (docs/spec.md §13.9; issue 38 item 3): two mutants per operation
# over every layer, killed by the layered-cache machine behind the default reference. The first is the shipped bug's
# kind: a loop over the layers that meets a layer never written (lazily initialised) after it changed the layers
# before it.
LAYERED_MUTANTS = (
    Mutant("layered_crop_raises_at_a_layer_never_written", "layered_cache.py",
           (("            if cache is not None:\n                cache.truncate(min(int(length), cache.length))\n",
             "            cache.truncate(min(int(length), cache.length))  # type: ignore[union-attr]\n"),),
           "a truncation crops the layers before a layer never written, then raises there (transformers' "
           "DynamicCache.crop over a lazily initialised layer)", "layered cache"),
    Mutant("layered_crop_writes_before_it_checks", "layered_cache.py",
           (("            raise InvalidLength(length, longest)\n",
             "            for cache in self._caches:\n"
             "                if cache is not None and isinstance(length, (int, float)):\n"
             "                    cache.truncate(max(0, min(int(length), cache.length)))\n"
             "            raise InvalidLength(length, longest)\n"),),
           "a truncation by an invalid n (negative, a bool, a float) crops every layer, then raises", "layered cache"),
    Mutant("layered_crop_checks_the_first_layer", "layered_cache.py",
           (("        longest = max(self.lengths)\n", "        longest = self.lengths[0]\n"),),
           "a truncation checks n against the first layer's length: n above it (that layer shorter than another, or "
           "never written) is refused", "layered cache"),
    Mutant("layered_reset_forgets_the_last_layer", "layered_cache.py",
           (("        for cache in self._caches:\n            if cache is not None:\n                cache.reset(",
             "        for cache in self._caches[:-1]:\n"
             "            if cache is not None:\n                cache.reset("),),
           "a reset empties every layer but the last", "layered cache"),
    Mutant("layered_reset_stops_at_a_layer_never_written", "layered_cache.py",
           (("            if cache is not None:\n                cache.reset(zero_storage=zero_storage)\n",
             "            if cache is None:\n                break\n"
             "            cache.reset(zero_storage=zero_storage)\n"),),
           "a reset stops at the first layer never written: the layers after it keep their rows", "layered cache"),
    Mutant("layered_reorder_raises_at_a_layer_never_written", "layered_cache.py",
           (("            if cache is not None:\n                cache.reorder(indices)\n",
             "            cache.reorder(indices)  # type: ignore[union-attr]\n"),),
           "a reorder gathers the layers before a layer never written, then raises there", "layered cache"),
    Mutant("layered_reorder_stops_at_a_layer_never_written", "layered_cache.py",
           (("            if cache is not None:\n                cache.reorder(indices)\n",
             "            if cache is None:\n                break\n            cache.reorder(indices)\n"),),
           "a reorder skips the layers after a layer never written: their rows stay where they were", "layered cache"),
    Mutant("layered_select_raises_at_a_layer_never_written", "layered_cache.py",
           (("            if cache is not None:\n                cache.select(indices)\n",
             "            cache.select(indices)  # type: ignore[union-attr]\n"),),
           "a select shrinks the layers before a layer never written, then raises there", "layered cache"),
    Mutant("layered_select_keeps_the_old_batch_of_a_layer_never_written", "layered_cache.py",
           (("        self.batch_size = len(indices)  # the size of a layer written later, too\n", ""),),
           "a select shrinks the layers written only: a layer never written keeps the old batch size (its snapshot, "
           "and its first write refused as of the wrong batch)", "layered cache"),
    Mutant("layered_repeat_keeps_the_old_batch_of_a_layer_never_written", "layered_cache.py",
           (("        self.batch_size *= int(repeats)  # type: ignore[call-overload]\n", ""),),
           "a repeat grows the layers written only: a layer never written keeps the old batch size", "layered cache"),
    Mutant("layered_append_wraps_a_negative_layer", "layered_cache.py",
           (("                or not 0 <= index < len(self.layers):\n",
             "                or not -len(self.layers) <= index < len(self.layers):\n"),),
           "a negative layer index wraps around (Python's list indexing): -1 appends to the last layer",
           "layered cache"),
    Mutant("layered_append_takes_a_bool_layer", "layered_cache.py",
           (("        if not isinstance(index, (int, np.integer)) or isinstance(index, (bool, np.bool_)) \\\n",
             "        if not isinstance(index, (int, np.integer)) \\\n"),),
           "a bool is taken as a layer index: True appends to layer 1", "layered cache"),
    Mutant("layered_append_through_the_first_layer", "layered_cache.py",
           (("        layer = self.layers[int(index)]\n", "        layer = self.layers[0]\n"),),
           "every layer's rows are computed with the first layer's parameters", "layered cache"),
)
MUTANTS = MUTANTS + LAYERED_MUTANTS


HELD_CELLS_SEEN = ("                held = ~(named[mine][:, None, :] & ~self.members[stream][None, :, :]).any(axis=2)"
                   "  # [m, C]\n")
# The whole model (impl/model.py, docs/spec.md §15): at least two visible mutants of each sequence operation, killed
# by the model machine behind the default reference.
MODEL_MUTANTS = (
    Mutant("model_decode_writes_then_raises_full", "model.py",
           (('                raise ContextFull(len(mine), len(free), "decoding the batch")',
             '                self.members[stream, free, sequences[mine][:len(free)]] = True\n'
             '                self.positions[stream, free] = positions[mine][:len(free)]\n'
             '                raise ContextFull(len(mine), len(free), "decoding the batch")'),),
           "a batch without room writes the tokens that fit, then raises full", "model"),
    Mutant("model_batch_sees_other_sequences", "model.py",
           (("batch = ~(named[mine][:, None, :] & ~named[mine][None, :, :]).any(axis=2)  # [m, m]",
             "batch = np.ones((len(mine), len(mine)), dtype=bool)  # [m, m]"),),
           "a token of a batch mixing sequences sees the other sequences' tokens of the batch", "model"),
    Mutant("model_remove_p1_inclusive", "model.py",
           (("((self.positions < p1) if p1 >= 0 else True)", "((self.positions <= p1) if p1 >= 0 else True)"),),
           "a range [p0, p1) includes p1 (seq_rm, and every ranged operation)", "model"),
    Mutant("model_remove_frees_shared_cells", "model.py",
           (("            self.members[..., seq] &= ~chosen\n",
             "            self.members[chosen & self.members[..., seq]] = False\n"),),
           "removing a shared cell from one sequence removes it from every sequence sharing it", "model"),
    Mutant("model_copy_shares_across_stores", "model.py",
           (("self.shared_copies, self.copy_into_nonempty = shared_copies and self.unified, copy_into_nonempty",
             "self.shared_copies, self.copy_into_nonempty = shared_copies, copy_into_nonempty"),),
           "a copy in a per-sequence context shares the source's cells instead of copying them into the destination's"
           " store", "model"),
    Mutant("model_copy_ignores_the_range", "model.py",
           (("picked = np.flatnonzero(chosen[source] & self.members[source, :, src])",
             "picked = np.flatnonzero(self.members[source, :, src])"),),
           "a range copy copies the whole source sequence", "model"),
    Mutant("model_copy_replaces_when_merging", "model.py",
           (('replacing = self.copy_into_nonempty != "merge"', "replacing = True"),),
           "declares merge, but a copy into a non-empty sequence drops its cells first", "model"),
    Mutant("model_keep_leaves_sharers", "model.py",
           (("        self.members[:] = False\n        self.members[..., seq] = kept\n",
             "        self.members[~kept] = False\n"),),
           "keep leaves a kept cell in the other sequences sharing it", "model"),
    Mutant("model_keep_reads_the_first_store", "model.py",
           (("        self.members[..., seq] = kept\n", "        self.members[0, :, seq] = kept[0]\n"),),
           "keep in a per-sequence context keeps the sequence's cells of the first store only", "model"),
    Mutant("model_shift_not_re_rotated", "model.py",
           (("self.keys[stream, layer, picked] = self._as_stored(self.model.rotate(layer, held, moved))",
             "self.keys[stream, layer, picked] = held"),),
           "a shift moves positions but leaves the stored keys rotated at the old ones", "model"),
    Mutant("model_shift_rotates_backwards", "model.py",
           (("moved = new_positions[picked] - self.positions[stream, picked]",
             "moved = self.positions[stream, picked] - new_positions[picked]"),),
           "a shift re-rotates the stored keys by minus the change of position", "model"),
    Mutant("model_divide_rounds_up", "model.py",
           (("self.positions[stream] // d)", "-(-self.positions[stream] // d))"),),
           "divide rounds p / d up instead of down", "model"),
    Mutant("model_divide_ignores_the_range", "model.py",
           (('self._move(seq, self._in_range(p0, p1, "seq_divide")[stream],',
             'self._move(seq, self._in_range(-1, -1, "seq_divide")[stream],'),),
           "divide divides every position of the sequence, whatever the range", "model"),
    Mutant("model_load_keeps_own_cells", "model.py",
           (("        self.remove(seq, -1, -1)\n        self._write(stream, seq, state.positions",
             "        self._write(stream, seq, state.positions"),),
           "a load keeps the destination's own cells beside the loaded ones", "model"),
    Mutant("model_load_into_the_first_store", "model.py",
           (('        stream = self.stream(seq)\n        only_seq = self.members[stream, :, seq]',
             '        stream = 0\n        only_seq = self.members[stream, :, seq]'),),
           "a load into another id of a per-sequence context writes into the first sequence's store", "model"),
    Mutant("model_clear_spares_the_first_sequence", "model.py",
           (("    def clear(self) -> None:\n        self.members[:] = False\n",
             "    def clear(self) -> None:\n        self.members[..., 1:] = False\n"),),
           "clear keeps the first sequence's cells", "model"),
    Mutant("model_clear_first_store_only", "model.py",
           (("    def clear(self) -> None:\n        self.members[:] = False\n",
             "    def clear(self) -> None:\n        self.members[0] = False\n"),),
           "clear empties only the first store of a per-sequence context", "model"),
    Mutant("model_q8_0_scale_of_the_first_block", "storage.py",
           (("        d = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)\n",
             "        d = np.abs(x[..., :1, :]).max(axis=-1, keepdims=True) / np.float32(127)\n"),),
           "declares a q8_0 cache, but scales every block of a row by its first block's: larger values clip",
           "model", factory="model_conformance:make_q8_0_model_adapter"),
    Mutant("model_q4_0_read_back_without_the_offset", "storage.py",
           (("np.floor(x * inverse + np.float32(8.5))) - np.float32(8)", "np.floor(x * inverse + np.float32(8.5)))"),),
           "declares a q4_0 cache, but reads its levels back without subtracting the offset 8",
           "model", factory="model_conformance:make_q4_0_model_adapter"),
    # -- block formats cut from each token's whole kv row (kv_storage along: row, #36) --
    Mutant("model_q8_0_row_read_back_heads_and_features_swapped", "model.py",
           (("            return whole.reshape(rows.shape).astype(self.kv_dtype)",
             "            return whole.reshape(*rows.shape[:-2], rows.shape[-1], rows.shape[-2]).swapaxes(-1, -2)"
             ".astype(self.kv_dtype)"),),
           "declares q8_0 blocks along the kv row, but reads the row back into heads feature-major: with two kv "
           "heads, each head's features are the two heads' interleaved",
           "model", factory="model_conformance:make_q8_0_row_model_adapter"),
    Mutant("model_q4_0_row_blocks_across_tokens", "model.py",
           (("            whole = stored_in_blocks(rows.reshape(*rows.shape[:-2], -1), self.kv_blocks)\n"
             "            return whole.reshape(rows.shape).astype(self.kv_dtype)",
             "            whole = stored_in_blocks(rows.swapaxes(-3, -2).reshape(*rows.shape[:-3], rows.shape[-2], -1),"
             " self.kv_blocks)\n"
             "            return whole.reshape(*rows.shape[:-3], rows.shape[-2], rows.shape[-3], rows.shape[-1])"
             ".swapaxes(-3, -2).astype(self.kv_dtype)"),),
           "declares q4_0 blocks along the kv row, but cuts them from its head-major layout flat: a block runs "
           "across tokens of one head, and a batch of one token with heads of 16 is not whole blocks",
           "model", factory="model_conformance:make_q4_0_row_model_adapter"),
    # -- affine groups as a whole model's kv_storage (#36) --
    Mutant("model_uint4_groups_read_back_without_the_minimum", "storage.py",
           (("stored: np.ndarray = (low + np.clip(np.rint((grouped - low) / step), 0, levels) * step).reshape(",
             "stored: np.ndarray = (np.clip(np.rint((grouped - low) / step), 0, levels) * step).reshape("),),
           "declares affine groups as its model's cache, but reads a group back without adding its minimum",
           "model", factory="model_conformance:make_uint4_groups_model_adapter"),
    # No model-level twin of affine_one_scale_per_token (one group a head): at twice the declared step it stays
    # within what a fair rule must allow a correct store (0.66-0.78 of the tolerance, honest engines up to 0.77;
    # docs/spec.md §15.6); the layer rule catches it on the cached rows, element by element.
    # behind a float32 model over a float32 cache: docs/spec.md §8.3's rule, not the storage rule
    Mutant("model_float32_probabilities_in_float16", "model.py",
           (("        weights /= weights.sum(axis=-1, keepdims=True)\n",
             "        weights = (weights / weights.sum(axis=-1, keepdims=True))"
             ".astype(np.float16).astype(self.dtype)\n"),),
           "declares float32, but rounds its attention probabilities to float16",
           "model", factory="model_conformance:make_float32_cache_model_adapter"),
    Mutant("model_float32_logits_from_float16", "model.py",
           (("        out: np.ndarray = _rms_norm(hidden, self.output_norm, self.shape.norm_eps, self.norm_dtype)"
             " @ self.output.T\n",
             "        out: np.ndarray = (_rms_norm(hidden, self.output_norm, self.shape.norm_eps, self.norm_dtype)\n"
             "                           .astype(np.float16).astype(self.dtype) @ self.output.T)\n"),),
           "declares float32, but rounds the final norm's output to float16 before the output head",
           "model", factory="model_conformance:make_float32_cache_model_adapter"),
    # docs/spec.md §15.4's loose ends: ranges, shifts past the model, self-contained states; §15.3's numpy ints
    Mutant("model_range_closed_from_the_start", "model.py",
           (("((self.positions < p1) if p1 >= 0 else True)",
             "((self.positions < p1 + (p0 < 0)) if p1 >= 0 else True)"),),
           "reads llama.h's comment \"p0 < 0 : [0, p1]\" as written: a range open at its start includes p1",
           "model"),
    Mutant("model_range_open_at_minus_one_only", "model.py",
           (("((self.positions < p1) if p1 >= 0 else True)", "((self.positions < p1) if p1 != -1 else True)"),),
           "reads only p1 = -1 as 'to the end': a range ending at -2 selects no cell", "model"),
    Mutant("model_shift_past_the_model_moves_then_refuses", "model.py",
           (("        if too_far:  # the RoPE table ends there: refused before anything moves\n",
             "        if too_far:\n            self._move(seq, chosen, self.positions[stream] + int(delta))\n"),),
           "refuses a shift past max_positions after moving the cells", "model"),
    Mutant("model_batch_numpy_ids_malformed", "model.py",
           (("            if not _is_int(token) or not 0 <= token < s.vocab:",
             "            if type(token) is not int or not 0 <= token < s.vocab:"),),
           "refuses numpy integer token ids (np.int64, np.int32) as a malformed batch", "model"),
    Mutant("model_saved_state_reads_the_live_context", "model.py",
           (("        return SequenceState(self.positions[stream, picked].copy(), self.tokens[stream, picked].copy(),\n"
             "                             self.keys[stream][:, picked].copy(), "
             "self.values[stream][:, picked].copy(),\n"
             "                             bool(self.filled[seq]))\n",
             "        context = self\n\n"
             "        class Live(SequenceState):  # the saved slots, read from this context when loaded\n"
             "            def __init__(self) -> None:\n"
             "                pass\n"
             "            positions = property(lambda _: context.positions[stream, picked])\n"
             "            tokens = property(lambda _: context.tokens[stream, picked])\n"
             "            keys = property(lambda _: context.keys[stream][:, picked])\n"
             "            values = property(lambda _: context.values[stream][:, picked])\n"
             "        return Live()\n"),),
           "a saved state keeps the cells' slots, not the cells: loaded after its context changed, it is what the "
           "slots hold then", "model"),
    # behind the reference declaring removal: end_only (impl.conformance:make_end_only_removal_adapter)
    Mutant("model_end_only_refuses_to_the_end", "model.py",
           (("        if self.end_only_removal and p1 >= 0:\n",
             "        if self.end_only_removal and (p1 >= 0 or p0 > 0):\n"),),
           "declares removal end_only, but refuses a removal to the end that starts past position 0", "model",
           factory="make_end_only_removal_adapter"),
    Mutant("model_end_only_refusal_changes_state", "model.py",
           (("            if (held & (self.positions >= p1)).any():\n",
             "            if (held & (self.positions >= p1)).any():\n"
             "                self.members[..., max(seq, 0)] &= ~chosen\n"),),
           "refuses a removal in the middle after removing the range from the sequence", "model",
           factory="make_end_only_removal_adapter"),
    Mutant("model_end_only_refusal_returns", "model.py",
           (("            if (held & (self.positions >= p1)).any():\n",
             "            if (held & (self.positions >= p1)).any():\n                return\n"),),
           "a removal in the middle it cannot do returns as if done, removing nothing", "model",
           factory="make_end_only_removal_adapter"),
    # behind the reference numbering positions itself (positions: from_zero, impl.conformance:
    # make_positions_from_zero_adapter)
    Mutant("model_from_zero_next_is_the_cell_count", "model.py",
           (("                following[key] = self.pos_max(key) + 1\n",
             "                following[key] = int(self.members[self.stream(key), :, key].sum())\n"),),
           "numbers a sequence's next token by the cells it holds (a cache's length), not its largest position + 1",
           "model", factory="make_positions_from_zero_adapter"),
    Mutant("model_from_zero_one_count_per_store", "model.py",
           (("                following[key] = self.pos_max(key) + 1\n",
             "                following[key] = int(self.positions[self.stream(key)].max()) + 1\n"),),
           "numbers a sequence's next token on from the largest position of its store (one count for a unified "
           "context), not of the sequence", "model", factory="make_positions_from_zero_adapter"),
    # tokens naming several sequences (multi_sequence_tokens), behind the default reference
    Mutant("model_shared_token_joins_its_first_sequence", "model.py",
           (("            self.members[stream, slot] = named[i]\n",
             "            self.members[stream, slot] = False\n"
             "            self.members[stream, slot, sequences[i]] = True\n"),),
           "a token naming several sequences becomes a cell of its first sequence alone (n_seq_id read as 1)", "model"),
    Mutant("model_shared_token_seen_by_the_same_sequences_only", "model.py",
           (("batch = ~(named[mine][:, None, :] & ~named[mine][None, :, :]).any(axis=2)  # [m, m]",
             "batch = (named[mine][:, None, :] == named[mine][None, :, :]).all(axis=2)  # [m, m]"),),
           "a token of the batch sees the batch's earlier tokens only if they name exactly its sequences: a "
           "sequence's own token after a shared prompt in one batch misses the prompt", "model"),
    # behind the reference computing batches in parts of 3 (model_limits micro_batch 3,
    # impl.conformance:make_micro_batch_adapter)
    Mutant("model_micro_batch_failure_keeps_earlier_parts", "model.py",
           (("        except ContextFull:\n            self._restore(kept)\n            raise\n",
             "        except ContextFull:\n            raise\n"),),
           "a part of a batch without room raises full, but the parts before it stay in the context", "model",
           factory="make_micro_batch_adapter"),
    Mutant("model_micro_batch_logits_in_reverse_parts", "model.py",
           (("        return np.concatenate(outputs)\n", "        return np.concatenate(outputs[::-1])\n"),),
           "returns the logits of a batch's parts last part first", "model", factory="make_micro_batch_adapter"),
    # windows at model level (#37): a ring that keeps every cell (as declared) but never attends again what fell
    # out of a token's window; the machine's window-edge rules bring such cells back (a removal at the end, a shift
    # or divide across the edge): killed at the ci seed's 7th example, where before them the 82nd was the first
    Mutant("model_window_drops_cells_for_good", "model.py",
           (("            self.members[stream, slot] = named[i]\n        self._mark_filled()\n",
             "            self.members[stream, slot] = named[i]\n"
             "            if s.window is not None:  # what fell out of this token's window is never attended again\n"
             "                gone = self.members[stream, :, sequences[i]] & (self.positions[stream] <= positions[i]"
             " - s.window)\n"
             "                self.tokens[stream, gone] = -1\n"
             "        self._mark_filled()\n"),
            (HELD_CELLS_SEEN, HELD_CELLS_SEEN + "                held &= (self.tokens[stream] >= 0)[None, :]\n")),
           "keeps the cells out of a windowed token's window but never attends them again, also where a removal at "
           "the end, a shift or a divide brings them back into the window", "model"),
    # behind the reference with no capacity limit (capacity: grows, impl.conformance:make_growing_adapter)
    Mutant("model_growth_loses_the_values", "model.py",
           (("        self.values = widened(self.values, 2, 0)\n",
             "        self.values = np.zeros_like(widened(self.values, 2, 0))\n"),),
           "grows by allocating larger stores, but copies the held cells' keys and not their values", "model",
           factory="make_growing_adapter"),
    Mutant("model_growth_forgets_the_sequences", "model.py",
           (("        self.members = widened(self.members, 1, False)\n",
             "        self.members = np.zeros_like(widened(self.members, 1, False))\n"),),
           "grows by allocating larger stores, but not the table of which sequences hold each cell: every cell held "
           "is freed", "model", factory="make_growing_adapter"),
    # behind the reference keeping only the cells its window can still see (window_cells: visible; docs/spec.md
    # §15.2), with kept sink tokens (attention_sinks)
    Mutant("model_evicts_a_cell_still_seen", "model.py",
           (("positions <= top + 1 - window)", "positions <= top + 2 - window)"),),
           "declares window_cells visible, but overwrites the oldest cell its sequence's next token still sees",
           "model", factory="model_conformance:make_windowed_store_model_adapter"),
    Mutant("model_eviction_frees_the_cell_for_every_sequence", "model.py",
           (("            self.members[stream, below, seq] = False\n",
             "            self.members[stream, below] = False\n"),),
           "declares window_cells visible, but evicting a cell from one sequence frees it for every sequence sharing "
           "it, also where the others still see it", "model",
           factory="model_conformance:make_windowed_store_model_adapter"),
    Mutant("model_evicts_the_sinks", "model.py",
           (("mine & (members.sum(axis=1) == 1) & (positions >= self.sinks) & (positions < top)",
             "mine & (members.sum(axis=1) == 1) & (positions < top)"),
            ("            below = members[:, seq] & (positions >= self.sinks) & (positions <= position)\n",
             "            below = members[:, seq] & (positions <= position)\n")),
           "keeps its sink tokens visible, but evicts them as the oldest cells once its store is full", "model",
           factory="model_conformance:make_windowed_store_model_adapter"),
    Mutant("model_sinks_lost_in_a_chunk", "model.py",
           (("cell_positions[None, :] < self.sinks)", "cell_positions[None, :] < (self.sinks if len(mine) == 1 "
             "else 0))"),),
           "keeps sink tokens, but a batch of two or more tokens sees them only within its window (the second "
           "engine's ring, masking a chunk by slot)", "model",
           factory="model_conformance:make_windowed_store_model_adapter"),
    Mutant("model_sinks_one_too_many", "model.py",
           (("cell_positions[None, :] < self.sinks)", "cell_positions[None, :] <= self.sinks)"),),
           "keeps S sink tokens, but every later token sees S + 1 (position S as a sink too)", "model",
           factory="model_conformance:make_windowed_store_model_adapter"),
    # behind the ring refusing removals to the end once full (window_removal: until_full)
    Mutant("model_ring_refuses_removing_every_cell", "model.py",
           (("and (self.members[..., one] & (self.positions < max(p0, 0))).any()]", "]"),),
           "declares window_removal until_full, but once full also refuses to remove every cell of the sequence",
           "model", factory="model_conformance:make_ring_model_adapter"),
    Mutant("model_ring_full_a_token_early", "model.py",
           (("self.filled |= self.members.sum(axis=(0, 1)) >= self.model.shape.window",
             "self.filled |= self.members.sum(axis=(0, 1)) >= self.model.shape.window - 1"),),
           "declares window_removal until_full, but refuses removals to the end from W - 1 tokens held", "model",
           factory="model_conformance:make_ring_model_adapter", examples=200),  # W - 1 tokens exactly, W >= 3
)
# -- the widened model (docs/spec.md §15.1, issue 37): per-layer windows, a local RoPE base, Gemma 3's switches --
WIDENED_MODEL_MUTANTS = (
    Mutant("model_local_layers_use_the_global_base", "model.py",
           (("self.inverse_frequencies = [float(local if window is not None else shape.rope_base)",
             "self.inverse_frequencies = [float(shape.rope_base)"),),
           "rotates the windowed layers with the global RoPE base instead of local_rope_base",
           "model", factory="model_conformance:make_gemma3_model_adapter",
           # a local base shows only in a windowed layer of a window of 2 or more with heads of 4 (a head of 2 turns
           # by the position alone, whatever the base): about one drawn model in ten; caught at example 120
           examples=200),
    Mutant("model_global_layers_windowed", "model.py",
           (("window = model.windows[layer]  # this layer's (None: a global layer)",
             "window = s.window  # this layer's (None: a global layer)"),),
           "windows every layer alike, the global layers of a window pattern too",
           "model", factory="model_conformance:make_gemma3_model_adapter"),
    Mutant("model_key_not_normed", "model.py",
           (('            k = _rms_norm(k, w["k_norm"], s.norm_eps, self.norm_dtype)\n', ""),),
           "Gemma's q/k norms: normalises the queries but not the keys",
           "model", factory="model_conformance:make_gemma3_model_adapter"),
    Mutant("model_activation_table_in_bfloat16", "model.py",
           (("self.activation_table = None if activation_table is None else np.dtype(activation_table)",
             'self.activation_table = None if activation_table is None else np.dtype(__import__("ml_dtypes").bfloat16)'
             ),),
           "declares its gate activation read from a float16 table, but reads it from a bfloat16 one",
           "model", factory="model_conformance:make_gelu_table_model_adapter"),
)
MUTANTS = MUTANTS + MODEL_MUTANTS + WIDENED_MODEL_MUTANTS


def build(mutant: Mutant, directory: Path, *also: Mutant) -> str:
    """Write the mutated copy of ``impl`` under ``directory`` (with the edits of ``also`` too: one implementation
    with several bugs); return its adapter spec."""
    name = "+".join(m.name for m in (mutant, *also))
    package = f"impl_mutant_{name.replace('+', '__')}"
    target = directory / package
    if not target.exists():
        shutil.copytree(IMPL, target, ignore=shutil.ignore_patterns("__pycache__"))
        for each in (mutant, *also):
            path = target / each.file
            source = path.read_text()
            for old, new in each.edits:
                count = source.count(old)
                if count != 1:
                    raise AssertionError(f"mutant {each.name}: {old!r} occurs {count} times in impl/{each.file}")
                source = source.replace(old, new)
            path.write_text(source)
        # Its own name: its own example database, and traces that say who failed.
        adapter = target / "conformance.py"
        text = adapter.read_text().replace('"impl-reference"', f'"impl-mutant-{name}"')
        for capability in {c for each in (mutant, *also) for c in each.undeclared}:
            if text.count(f'"{capability}", ') != 1:
                raise AssertionError(f"mutant {name}: the reference does not declare {capability!r} once")
            text = text.replace(f'"{capability}", ', "")
        adapter.write_text(text)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    importlib.invalidate_caches()
    module, _, factory = mutant.factory.rpartition(":")
    return f"{package}.{module or 'conformance'}:{factory}"


@dataclass(frozen=True)
class Kill:
    """How the machine caught a mutant."""

    mutant: str
    family: str  # the machine run (RoPE pairing, attention kind) that failed
    examples: int  # examples run up to and including the first failing one
    total_runs: int  # with shrinking
    shrunk_steps: int  # steps in the minimal failing program
    message: str
    trace: Path | None  # the shrunk run, replayable against any implementation


def runs_for(mutant: Mutant) -> list[tuple[str, str, dict[str, Any]]]:
    """(family, machine, parameters) of every machine run that may kill ``mutant``, in order."""
    if mutant.machine == "layer cache":  # the layer property: every family, drawn per example
        return [("layer", "layer_cache", {})]
    if mutant.machine == "session":
        return [("session", "session", {})]
    if mutant.machine == "paged":
        return [("paged", "paged", {})]
    if mutant.machine == "model":
        return [("model", "model", {})]
    if mutant.machine == "batches":
        return [("batches", "batches", {})]
    if mutant.machine == "layered cache":
        return [("layered", "layered_cache", {})]
    if mutant.machine in ("cache operations", "window cache"):  # a window mutant: the windowed run only
        return [(f"operations/{'window' if windowed else 'full'}", "cache_operations", {"windowed": windowed})
                for windowed in ((True,) if mutant.machine == "window cache" else (False, True))]
    return [(f"store/{'window' if windowed else 'full'}", "prefix_store", {"windowed": windowed})
            for windowed in (False, True)]


def kill(mutant: Mutant, directory: Path, trace_dir: Path | None = None,
         shrink_seconds: float | None = None) -> Kill | None:
    """Run the mutant's machines under the ``ci`` profile against it; None if it survives. ``shrink_seconds``:
    the shrink budget after the kill (default: the suite's own, ``runner.SHRINK_SECONDS``)."""
    from kvcache_conformance.judge.failures import NonConformance
    from kvcache_conformance.run import profiles, selection
    from kvcache_conformance.run.runner import run_machine

    spec = build(mutant, directory)
    adapter: Any = selection.load_adapter(spec)
    ci = profiles.settings_for("ci", database=None, report_multiple_bugs=False, print_blob=False,
                               max_examples=mutant.examples)
    for family, machine, parameters in runs_for(mutant):
        result = run_machine(machine, adapter, property_id=f"{machine}[{family}]", parameters=parameters,
                             requires=(), trace_dir=trace_dir, settings=ci, spec=spec, shrink_seconds=shrink_seconds)
        if isinstance(result.failure, NonConformance):
            return Kill(mutant.name, family, result.first_failing or result.runs, result.runs, result.steps,
                        str(result.failure).splitlines()[0], result.trace)
        if result.failure is not None:
            raise result.failure
    return None


def recorded_name(document: dict[str, Any]) -> str:
    """The name of the mutant a corpus trace was recorded from: its implementation is ``impl-mutant-NAME`` or
    ``impl-mutant-NAME[adapter]``."""
    return str(document["recorded_with"]["implementation"]).removeprefix("impl-mutant-").split("[")[0]


def recorded_mutant(document: dict[str, Any]) -> Mutant:
    """The mutant a corpus trace was recorded from."""
    name = recorded_name(document)
    found = next((m for m in MUTANTS if m.name == name), None)
    if found is None:
        raise KeyError(f"the trace was recorded from {name!r}, which is no mutant of tests/mutants.py")
    return found


def write_corpus(directory: Path, names: list[str] | None = None) -> None:
    """Kill each named mutant (all by default) and keep the trace of its shrunk run in ``directory``."""
    import tempfile

    chosen = [m for m in MUTANTS if names is None or m.name in names]
    unknown = set(names or ()) - {m.name for m in chosen}
    if unknown:
        raise SystemExit(f"no such mutant: {', '.join(sorted(unknown))}")
    directory.mkdir(parents=True, exist_ok=True)
    builds = Path(tempfile.mkdtemp())
    for mutant in chosen:
        for old in directory.glob("impl-mutant-*.json"):  # its earlier traces, whatever the adapter's suffix
            if recorded_name(json.loads(old.read_text())) == mutant.name:
                old.unlink()
        caught = kill(mutant, builds, trace_dir=directory)
        if caught is None:
            raise SystemExit(f"{mutant.name} survived: no trace written")
        print(f"{mutant.name}: example {caught.examples}, {caught.shrunk_steps} steps -> {caught.trace}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.mutants",
                                     description="Rewrite the regression corpus from the mutants' shrunk runs.")
    parser.add_argument("--corpus", type=Path, default=Path(__file__).parent.parent / "properties" / "regressions")
    parser.add_argument("names", nargs="*", help="mutants to rerun (default: all)")
    options = parser.parse_args()
    write_corpus(options.corpus, options.names or None)
