"""A paged KV cache shared by many sequences, with hash-chained prefix sharing (docs/spec.md §14).

The pool holds ``num_blocks`` blocks of ``block_size`` rows for every layer of
the decoders it serves. Each sequence maps its rows to blocks through a block
table. A full block is registered under a chained hash of its parent's hash,
its tokens and the policy's extra keys (scope, computation signature), so a
later sequence with the same prefix under the same keys reuses it instead of
recomputing it. Only full blocks are ever shared; a sequence that would write
into a shared or registered block copies it first. A block no table holds but
whose content is registered stays cached until the pool needs the room.

Every operation validates and computes first, then commits: a call that raises
changes nothing, and running out of blocks raises ``BlocksExhausted`` before
anything is evicted.

Block ids are page numbers; with ``padding_page`` page 0 is reserved for the
padded slots of a batch (written on every step, never handed out) and the
pool's blocks are pages ``1..num_blocks``, as a radix-tree engine numbers them.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .attention import AttentionLayer
from .decoder import Decoder, validate_tokens
from .errors import CacheFull, CacheLayerRevisionMismatch, InvalidLayerConfig, InvalidLength, NonFiniteAttention
from .parameters import Parameter
from .prefix_store import computation_signature

HASH_KEYS = ("scope", "signature", "lora", "multimodal", "salt")  # what a block hash may cover besides parent, tokens
REQUEST_KEYS = ("lora", "multimodal", "salt")  # given with each add (a LoRA adapter's name, ...); "" means none
EVICTIONS = ("lru", "all_at_once", "lru_nodes")  # which cached blocks make room: the least recently cached, all
# of them, or whole least recently cached nodes (a radix tree's leaves: the run of blocks one release cached)
HIT_LIMITS = ("before_last_token", "before_last_full_block", "drops_last_hit")  # how many full blocks an add reuses
DUPLICATES = ("private_or_swap", "registered")  # a block filling with registered content: kept private, or registered
FORKS = ("shared", "re_add", "none")  # how a fork gets its rows: shared blocks, an add of its tokens, not at all
HIT_COPIES = ("any", "cached_first")  # of several registered copies a hit takes the first; or a cached one first


class BlocksExhausted(CacheFull):
    """More blocks are needed than are free or evictable; nothing was changed."""

    def __init__(self, needed: int, available: int, total: int) -> None:
        self.needed, self.available, self.capacity = needed, available, total
        Exception.__init__(self, f"the paged pool needs {needed} more blocks but only {available} of {total} are "
                                 "free or evictable; free a sequence or create a larger pool")


class UnknownSequence(InvalidLayerConfig):
    """The sequence id is not live in this pool (never added, or freed)."""


class ForkNotOffered(InvalidLayerConfig):
    """A pool created with ``fork="none"`` has no fork (its adapter offers no ``paged_fork``)."""


@dataclass(frozen=True)
class Geometry:
    """What every decoder served by one pool must share: the shape of a block."""

    layers: int
    kv_heads: int
    head_width: int

    @classmethod
    def of(cls, model: Decoder) -> Geometry:
        return cls(len(model.blocks), model.blocks[0].kv_heads, model.blocks[0].head_width)


@dataclass
class Sequence:
    """One live sequence: its tokens, the block holding each run of ``block_size`` rows, what computed them."""

    model: Decoder
    scope: str
    keys: tuple[tuple[str, str], ...]  # the request keys the hash covers, each (name, value); "" is none
    tokens: list[int]
    table: list[int]
    signature: str  # of the weights its rows were computed with
    versions: tuple[int, ...]  # every layer parameter's version then (a later in-place write makes it stale)


@dataclass(frozen=True, eq=False)
class AddResult:
    """What ``add`` did: the new sequence's id, the logits of the positions it computed, the tokens reused."""

    sequence: int
    logits: np.ndarray  # [len(tokens) - reused, vocab]
    reused: int  # tokens whose rows came from shared blocks (a multiple of the block size)


@dataclass(frozen=True, eq=False)
class LayerRows:
    """One layer's rows of a sequence: ``keys`` (rotated under RoPE), ``values [KV, n, dh]`` at ``positions [n]``."""

    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


@dataclass(frozen=True)
class PoolState:
    """The pool's accounting, as copies: free count, cached blocks (next evicted first), references, tables."""

    total: int
    free: int
    cached: tuple[int, ...]
    references: dict[int, int]  # block -> number of tables holding it (referenced blocks only)
    tables: dict[int, tuple[int, ...]]  # sequence id -> its blocks, first rows first


@dataclass(frozen=True, eq=False)
class _Computed:
    """A computation over a sequence's held rows, not yet written: per layer keys and values ``[KV, T, dh]``."""

    logits: np.ndarray
    keys: tuple[np.ndarray, ...]
    values: tuple[np.ndarray, ...]


class PagedPool:
    """Blocks, block tables, reference counts, a hash registry and an LRU of cached blocks."""

    def __init__(self, layers: int, kv_heads: int, head_width: int, block_size: int, num_blocks: int, *,
                 hash_keys: Iterable[str] = ("scope", "signature"), eviction: str = "lru",
                 hit_limit: str = "before_last_token", fork: str = "shared",
                 duplicates: str = "private_or_swap", hit_copy: str = "any", padding_page: bool = False) -> None:
        for name, value in (("layers", layers), ("kv heads", kv_heads), ("head width", head_width),
                            ("block size", block_size), ("block count", num_blocks)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidLayerConfig(f"paged pool: {name} must be an int >= 1, got {value!r}")
        self.hash_keys = frozenset(hash_keys)
        if not self.hash_keys <= set(HASH_KEYS) or eviction not in EVICTIONS or hit_limit not in HIT_LIMITS \
                or fork not in FORKS or duplicates not in DUPLICATES or hit_copy not in HIT_COPIES:
            raise InvalidLayerConfig(f"paged pool: hash keys within {HASH_KEYS}, eviction one of {EVICTIONS}, "
                                     f"hit limit one of {HIT_LIMITS}, fork one of {FORKS}, duplicates one of "
                                     f"{DUPLICATES}, hit copy one of {HIT_COPIES}")
        self.geometry = Geometry(layers, kv_heads, head_width)
        self.block_size, self.num_blocks = block_size, num_blocks
        self.eviction, self.hit_limit, self.fork_policy, self.duplicates = eviction, hit_limit, fork, duplicates
        self.hit_copy = hit_copy
        first = int(padding_page)  # page 0, if reserved, is padding: never a block of the pool
        pages = num_blocks + first
        shape = (pages, layers, kv_heads, block_size, head_width)
        self._keys, self._values = np.zeros(shape), np.zeros(shape)
        self._references = np.zeros(pages, dtype=np.int64)
        self._padding = padding_page
        self._free = list(range(pages - 1, first - 1, -1))  # popped from the end: the lowest page first
        self._cached: OrderedDict[int, int] = OrderedDict()  # unreferenced, registered, oldest first -> its node
        self._releases = 0  # numbers the nodes: the run of blocks one release cached
        self._block_of: dict[bytes, list[int]] = {}  # registered chain hash -> its blocks, first registered first
        self._hash_of: dict[int, bytes] = {}  # block -> its registered chain hash
        self._sequences: dict[int, Sequence] = {}
        self._next_id = 0

    # -- reading -----------------------------------------------------------------------------------------

    def state(self) -> PoolState:
        return PoolState(self.num_blocks, len(self._free), tuple(self._cached),
                         {int(b): int(n) for b, n in enumerate(self._references) if n},
                         {sid: tuple(s.table) for sid, s in self._sequences.items()})

    def rows(self, sequence: int) -> tuple[LayerRows, ...]:
        """Copies of every layer's rows of ``sequence``, positions ``0..len-1``."""
        held = self._sequence(sequence)
        keys, values = self._gather(held.table, len(held.tokens))
        positions = np.arange(len(held.tokens))
        return tuple(LayerRows(keys[layer], values[layer], positions.copy()) for layer in range(self.geometry.layers))

    def tokens(self, sequence: int) -> list[int]:
        return list(self._sequence(sequence).tokens)

    # -- operations --------------------------------------------------------------------------------------

    def add(self, model: Decoder, scope: str, tokens: object, keys: object = None) -> AddResult:
        """A new sequence: reuse the longest registered prefix (whole blocks, hit limit); compute the rest."""
        ids = [int(t) for t in validate_tokens(tokens, model.vocab)]
        self._check_model(model)
        if not isinstance(scope, str):
            raise InvalidLayerConfig(f"paged pool: scope must be a str, got {type(scope).__name__}")
        request = self._request_keys(keys)
        signature = computation_signature(model)
        hit = self._longest_hit(ids, scope, signature, request)
        reused = len(hit) * self.block_size
        needed = self._blocks_for(len(ids)) - len(hit)
        self._check_room(needed, keep=hit)
        computed = self._compute(model, hit, reused, ids[reused:])
        for block in hit:
            self._acquire(block)
        table = hit + self._take(needed)
        held = Sequence(model, scope, request, ids, table, signature, _versions(model))
        self._write(held, reused, computed)
        sequence, self._next_id = self._next_id, self._next_id + 1
        self._sequences[sequence] = held
        self._register(held, reused)
        return AddResult(sequence, computed.logits, reused)

    def append(self, sequence: int, tokens: object) -> np.ndarray:
        """Compute ``T >= 1`` tokens causally at positions ``len..len+T-1``; logits ``[T, vocab]``. All or nothing."""
        held = self._sequence(sequence)
        ids = [int(t) for t in validate_tokens(tokens, held.model.vocab)]
        self._check_fresh(held)
        start = len(held.tokens)
        copy = self._copy_on_write(held)
        needed = self._blocks_for(start + len(ids)) - len(held.table) + (copy is not None)
        self._check_room(needed)
        computed = self._compute(held.model, held.table, start, ids)
        if copy is not None:
            held.table[copy] = self._copied(held.table[copy])
        held.table.extend(self._take(self._blocks_for(start + len(ids)) - len(held.table)))
        held.tokens.extend(ids)
        self._write(held, start, computed)
        self._register(held, start)
        logits: np.ndarray = computed.logits
        return logits

    def fork(self, sequence: int) -> int:
        """A new sequence with the same rows: full blocks shared, a partial last block copied; or (``re_add``)
        the parent's tokens added again in its scope, as engines fork for parallel sampling."""
        held = self._sequence(sequence)
        if self.fork_policy == "none":
            raise ForkNotOffered("this pool was created with fork='none': it does not fork")
        if self.fork_policy == "re_add":
            return self.add(held.model, held.scope, held.tokens, dict(held.keys)).sequence
        full = len(held.tokens) // self.block_size
        needed = len(held.table) - full
        self._check_room(needed)
        shared = held.table[:full]
        for block in shared:
            self._acquire(block)
        copies = [self._copy_of(block) for block in held.table[full:]]
        child, self._next_id = self._next_id, self._next_id + 1
        self._sequences[child] = Sequence(held.model, held.scope, held.keys, list(held.tokens), shared + copies,
                                          held.signature, held.versions)
        return child

    def truncate(self, sequence: int, length: object) -> None:
        """Keep the first ``length`` tokens; blocks wholly past them are released. The next append copies a
        shared or registered block before writing into it."""
        held = self._sequence(sequence)
        if not isinstance(length, (int, np.integer)) or isinstance(length, (bool, np.bool_)) \
                or not 0 <= length <= len(held.tokens):
            raise InvalidLength(length, len(held.tokens))
        keep = self._blocks_for(int(length))
        dropped = held.table[keep:]
        del held.table[keep:]
        del held.tokens[int(length):]
        self._release_all(dropped)

    def free(self, sequence: int) -> None:
        """Release every block of ``sequence``; registered ones stay cached for reuse."""
        held = self._sequence(sequence)
        del self._sequences[sequence]
        self._release_all(held.table)

    # -- the rules ---------------------------------------------------------------------------------------

    def chain(self, tokens: list[int], scope: str, signature: str, blocks: int,
              request: tuple[tuple[str, str], ...] = ()) -> list[bytes]:
        """The chained hash of each of the first ``blocks`` full blocks of ``tokens``. Every extra key is tagged
        with its name: a LoRA adapter named "X" and a salt "X" are different keys (vLLM #44701)."""
        extra = b"".join(f"{key}={value}\0".encode() for key, value in (("scope", scope), ("signature", signature))
                         if key in self.hash_keys)
        extra += b"".join(f"{key}={value}\0".encode() for key, value in request if value)
        hashes, parent = [], b""
        for index in range(blocks):
            run = tokens[index * self.block_size:(index + 1) * self.block_size]
            digest = hashlib.sha256(parent)
            digest.update(np.asarray(run, dtype=np.int64).tobytes())
            digest.update(extra)
            parent = digest.digest()
            hashes.append(parent)
        return hashes

    def _longest_hit(self, tokens: list[int], scope: str, signature: str,
                     request: tuple[tuple[str, str], ...]) -> list[int]:
        """Registered blocks of the longest hashed prefix, at most as many as the hit limit allows."""
        if self.hit_limit == "before_last_full_block":
            limit = max(0, len(tokens) // self.block_size - 1)
        else:
            limit = (len(tokens) - 1) // self.block_size  # the last token is always recomputed
        hit = []
        for digest in self.chain(tokens, scope, signature, limit, request):
            blocks = self._block_of.get(digest)
            if not blocks:
                break
            # of several registered copies, the first (as vLLM serves them); or a cached one, if any
            cached = [block for block in blocks if block in self._cached] if self.hit_copy == "cached_first" else []
            hit.append((cached or blocks)[0])
        if self.hit_limit == "drops_last_hit":  # a draft head (EAGLE) recomputes the last matched block
            return hit[:-1]
        return hit

    def _register(self, held: Sequence, start: int) -> None:
        """Register the blocks of ``held`` that became full since it had ``start`` tokens. A duplicate of a
        registered chain stays unregistered for good (the registered block serves later hits), or, with
        ``duplicates="registered"``, is registered too: several blocks per hash, each evicted on its own."""
        full = len(held.tokens) // self.block_size
        chain = self.chain(held.tokens, held.scope, held.signature, full, held.keys)
        for index in range(start // self.block_size, full):
            block, digest = held.table[index], chain[index]
            if block not in self._hash_of and (self.duplicates == "registered" or digest not in self._block_of):
                self._block_of.setdefault(digest, []).append(block)
                self._hash_of[block] = digest

    def _request_keys(self, keys: object) -> tuple[tuple[str, str], ...]:
        """The declared request keys of an add, each with a str value ("" means none, left out of the hash)."""
        wanted = sorted(self.hash_keys & set(REQUEST_KEYS))
        given = {} if keys is None else keys
        if not isinstance(given, dict) or sorted(given) != wanted or \
                not all(isinstance(value, str) for value in given.values()):
            raise InvalidLayerConfig(f"paged pool: keys must map exactly {wanted} to strs, got {keys!r}")
        return tuple((name, given[name]) for name in wanted)

    def _copy_on_write(self, held: Sequence) -> int | None:
        """The index of the block the next row lands in, if it is shared or registered (it must be copied)."""
        start = len(held.tokens)
        if start % self.block_size == 0:
            return None
        index = start // self.block_size
        block = held.table[index]
        return index if self._references[block] > 1 or block in self._hash_of else None

    # -- blocks ------------------------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _check_room(self, needed: int, keep: Iterable[int] = ()) -> None:
        """Raise ``BlocksExhausted`` unless ``needed`` blocks are free or evictable (``keep`` is about to be reused)."""
        kept = set(keep)
        evictable = sum(1 for block in self._cached if block not in kept)
        if needed > len(self._free) + evictable:
            raise BlocksExhausted(needed, len(self._free) + evictable, self.num_blocks)

    def _take(self, count: int) -> list[int]:
        """``count`` blocks, each with one reference; cached blocks are evicted only when too few are free."""
        if count > len(self._free):
            victims = list(self._cached) if self.eviction == "all_at_once" else \
                self._whole_nodes(count - len(self._free)) if self.eviction == "lru_nodes" else \
                list(self._cached)[:count - len(self._free)]
            for block in victims:
                del self._cached[block]
                self._unregister(block)
                self._free.append(block)
        taken = [self._free.pop() for _ in range(count)]
        self._references[taken] = 1
        return taken

    def _whole_nodes(self, shortfall: int) -> list[int]:
        """Whole nodes, least recently cached first, until at least ``shortfall`` blocks: a node's blocks were
        cached by one release as one run of a table (what is left of it once hits took its first blocks back)."""
        victims: list[int] = []
        for node in dict.fromkeys(self._cached.values()):  # nodes, oldest first
            if len(victims) >= shortfall:
                break
            victims += [block for block, of in self._cached.items() if of == node]
        return victims

    def _unregister(self, block: int) -> None:
        """An evicted block leaves the registry; other copies of its content stay registered."""
        digest = self._hash_of.pop(block)
        self._block_of[digest].remove(block)
        if not self._block_of[digest]:
            del self._block_of[digest]

    def _acquire(self, block: int) -> None:
        self._cached.pop(block, None)
        self._references[block] += 1

    def _release_all(self, blocks: list[int]) -> None:
        """Last block first: within one release, a sequence's tail is evicted before its prefix. Each run of
        consecutive blocks it caches is one node (a block that stays referenced or goes free ends a run)."""
        self._releases += 1
        for block in reversed(blocks):
            self._references[block] -= 1
            if self._references[block] == 0 and block in self._hash_of:
                self._cached[block] = self._releases
                continue
            if self._references[block] == 0:
                self._free.append(block)
            self._releases += 1

    def _copy_of(self, block: int) -> int:
        """A new private block holding ``block``'s rows."""
        (copy,) = self._take(1)
        self._keys[copy], self._values[copy] = self._keys[block], self._values[block]
        return copy

    def _copied(self, block: int) -> int:
        """Copy-on-write: a private copy of ``block`` replaces one reference to it."""
        copy = self._copy_of(block)
        self._release_all([block])
        return copy

    # -- computing -----------------------------------------------------------------------------------------

    def _compute(self, model: Decoder, table: list[int], start: int, tokens: list[int]) -> _Computed:
        """``tokens`` at positions ``start..``, attending over the first ``start`` rows of ``table``; writes nothing."""
        held_keys, held_values = self._gather(table, start)  # [layers, KV, start, dh]
        positions = np.arange(start, start + len(tokens))
        hidden = model.embed(np.asarray(tokens, dtype=np.int64), start)[0]  # [T, D]
        keys, values = [], []
        for layer, block in enumerate(model.blocks):
            query, key, value = _project(block, hidden, positions)
            all_keys = np.concatenate([held_keys[layer], key], axis=1)  # [KV, start + T, dh]
            all_values = np.concatenate([held_values[layer], value], axis=1)
            mixed = _causal_attention(query, all_keys, all_values, start)  # [T, H*dh]
            hidden = hidden + np.tanh(mixed @ block.wo.value)
            keys.append(key)
            values.append(value)
        logits: np.ndarray = model.logits(hidden)  # [T, vocab]
        if not np.isfinite(logits).all():
            raise NonFiniteAttention("logits", int(np.argmin(np.isfinite(logits).ravel())), float("nan"))
        return _Computed(logits, tuple(keys), tuple(values))

    def _gather(self, table: list[int], length: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``length`` rows of ``table`` as ``[layers, KV, length, dh]`` copies."""
        blocks = np.asarray(table[:self._blocks_for(length)], dtype=np.int64)
        layers, kv, _, dh = self.geometry.layers, self.geometry.kv_heads, self.block_size, self.geometry.head_width

        def flat(storage: np.ndarray) -> np.ndarray:
            picked = storage[blocks].transpose(1, 2, 0, 3, 4)  # [layers, KV, blocks, block_size, dh]
            rows: np.ndarray = picked.reshape(layers, kv, -1, dh)[:, :, :length]
            return rows

        return flat(self._keys), flat(self._values)

    def _write(self, held: Sequence, start: int, computed: _Computed) -> None:
        """Rows ``start..`` of ``held`` into its blocks (every block written is private to it)."""
        count = computed.keys[0].shape[1]
        slots = np.arange(start, start + count)
        blocks = np.asarray(held.table, dtype=np.int64)[slots // self.block_size]
        offsets = slots % self.block_size
        for layer in range(self.geometry.layers):
            self._keys[blocks, layer, :, offsets] = computed.keys[layer].transpose(1, 0, 2)  # [T, KV, dh]
            self._values[blocks, layer, :, offsets] = computed.values[layer].transpose(1, 0, 2)
        if self._padding:  # a padded batch's empty slots write into page 0
            self._keys[0], self._values[0] = 0.0, 0.0

    # -- checks --------------------------------------------------------------------------------------------

    def _sequence(self, sequence: int) -> Sequence:
        held = self._sequences.get(sequence) if isinstance(sequence, int) else None
        if held is None:
            raise UnknownSequence(f"sequence {sequence!r} is not live in this pool")
        return held

    def _check_model(self, model: Decoder) -> None:
        if Geometry.of(model) != self.geometry or model.window is not None:
            raise InvalidLayerConfig("paged pool: the decoder's layers, kv heads and head width must be the pool's, "
                                     "without a sliding window")

    def _check_fresh(self, held: Sequence) -> None:
        """The rows were computed with the parameters as they are now (an in-place write makes them stale)."""
        for index, (recorded, parameter) in enumerate(zip(held.versions, _parameters(held.model))):
            if parameter.version != recorded:
                raise CacheLayerRevisionMismatch(index, recorded, parameter.version)


def _parameters(model: Decoder) -> list[Parameter]:
    return [model.embedding, *(p for block in model.blocks for p in block.parameters)]


def _versions(model: Decoder) -> tuple[int, ...]:
    return tuple(p.version for p in _parameters(model))


def _project(block: AttentionLayer, hidden: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, ...]:
    """Queries ``[H, T, dh]``, keys and values ``[KV, T, dh]`` of ``hidden [T, D]``, rotated at ``positions``."""
    tokens, dh = hidden.shape[0], block.head_width

    def heads(y: np.ndarray, count: int) -> np.ndarray:
        split: np.ndarray = y.reshape(tokens, count, dh).transpose(1, 0, 2)
        return split

    angles = block.rope.angles(positions)
    query = block.rope.rotate_with(heads(hidden @ block.wq.value, block.heads), angles)
    key = block.rope.rotate_with(heads(hidden @ block.wk.value, block.kv_heads), angles)
    return query, key, heads(hidden @ block.wv.value, block.kv_heads)


def _causal_attention(query: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int) -> np.ndarray:
    """``query [H, T, dh]`` at positions ``start..`` over ``keys``/``values [KV, start + T, dh]``; ``[T, H*dh]``."""
    heads, tokens, dh = query.shape
    kv = keys.shape[0]
    grouped = query.reshape(kv, heads // kv, tokens, dh)  # head h reads kv head h // (H / KV)
    scores = grouped @ keys[:, None].swapaxes(-1, -2) / math.sqrt(dh)  # [KV, G, T, start + T]
    hidden = np.arange(keys.shape[1])[None, :] > (start + np.arange(tokens))[:, None]  # later keys
    scores = np.where(hidden, -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    mixed = weights @ values[:, None]  # [KV, G, T, dh]
    merged: np.ndarray = mixed.reshape(heads, tokens, dh).transpose(1, 0, 2).reshape(tokens, heads * dh)
    return merged
