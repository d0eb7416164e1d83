"""Fixed-size KV blocks with reference counts and a prefix cache over full blocks.

The KV pool holds `num_blocks` blocks of `block_size` token slots. A sequence's block
table lists its blocks in position order: token p lives in slot
`block_table[p // block_size] * block_size + p % block_size`.

Prefix cache. A FULL block is named by a hash chain, h_i = hash((h_{i-1}, tokens of
block i)), rooted in the cache epoch; equal chains mean equal whole prefixes, and the
block's token ids are compared on every hit, so a hash collision is never a false hit.
A block is registered when the step that computes its last token is scheduled: within
a forward pass every layer writes all new K/V before any attention reads, so a
sequence scheduled later in the same step may already share it. That is how a GRPO
group's G samples compute their prompt once.

Freed blocks keep their hash and K/V and wait in an LRU free list, so an agent's next
turn (history + new message) finds its history there; allocation takes blocks that
hold nothing shareable first, then evicts the least recently freed. `reset_cache`
(after a weight update) starts a new epoch: nothing computed before it is shared.

Out of scope: sharing partial blocks (copy-on-write), eviction policies other than
LRU, swapping blocks to host memory.
"""

from __future__ import annotations

from collections import OrderedDict

from polyrl.engine.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        """Free block ids, next to be reused first: unhashed ones, then least recently freed."""
        self.hash_to_block: dict[int, int] = {}
        self.epoch = 0
        self.high_water = 0
        """1 + the highest block id ever handed out (fresh blocks come in id order)."""

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def chain_hash(self, parent: int | None, tokens: tuple[int, ...]) -> int:
        return hash((self.epoch if parent is None else parent, tokens))

    # ---- admission of a waiting sequence -------------------------------------------------

    def match_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """(block ids, chain hashes) of the longest run of the sequence's full blocks that
        the cache holds. Takes no references."""
        ids: list[int] = []
        hashes: list[int] = []
        if not self.enable_prefix_caching:
            return ids, hashes
        parent = None
        for i in range(len(seq) // self.block_size):
            tokens = seq.block_tokens(i, self.block_size)
            h = self.chain_hash(parent, tokens)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            ids.append(block_id)
            hashes.append(h)
            parent = h
        return ids, hashes

    def can_allocate(self, hits: list[int], num_tokens: int) -> bool:
        """Room for a sequence whose first len(hits) blocks are cached and which will hold
        KV for num_tokens positions after this step? Cached blocks that sit in the free
        list are taken out of it, so they count against the free blocks too."""
        fresh = max(self.blocks_for(num_tokens) - len(hits), 0)
        from_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return fresh + from_free <= len(self.free)

    def allocate(self, seq: Sequence, hits: list[int], hashes: list[int], num_tokens: int) -> None:
        """Give `seq` the cached blocks `hits` and fresh blocks up to num_tokens positions."""
        assert not seq.block_table, "allocate is for sequences without blocks"
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
        seq.block_table = list(hits)
        seq.block_hashes = list(hashes)
        seq.cache_epoch = self.epoch
        seq.admissions += 1
        self.append_blocks(seq, num_tokens)

    # ---- growth of a running sequence ----------------------------------------------------

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - len(seq.block_table) <= len(self.free)

    def append_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Grow the block table to cover num_tokens positions."""
        for _ in range(self.blocks_for(num_tokens) - len(seq.block_table)):
            seq.block_table.append(self._take_free())

    def register_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Hash the sequence's blocks that are full once its first num_tokens positions are
        computed, and offer them to other sequences."""
        full = num_tokens // self.block_size
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            tokens = seq.block_tokens(i, self.block_size)
            h = self.chain_hash(seq.block_hashes[-1] if seq.block_hashes else None, tokens)
            seq.block_hashes.append(h)
            if not self.enable_prefix_caching or seq.cache_epoch != self.epoch:
                continue
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash, block.token_ids = h, tokens
                self.hash_to_block.setdefault(h, block.block_id)

    # ---- release -------------------------------------------------------------------------

    def deallocate(self, seq: Sequence) -> None:
        """Drop the sequence's references; blocks nobody holds go to the free list (tail
        blocks first, so a shared head outlives the tail under LRU eviction)."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} freed twice"
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
                if block.hash is None:
                    self.free.move_to_end(block_id, last=False)  # nothing to share: reuse first
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0

    def reset_cache(self) -> None:
        """Forget every cached prefix (the weights changed); blocks in use stay with their
        owners but are never offered again."""
        self.epoch += 1
        self.hash_to_block.clear()
        for block in self.blocks:
            block.hash, block.token_ids = None, ()

    def _take_free(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        self.high_water = max(self.high_water, block_id + 1)
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block_id

    def check_invariants(self, live: list[Sequence]) -> None:
        """Ref counts equal the number of live block tables holding each block; free list =
        blocks with ref 0. For tests and debugging."""
        counts = [0] * len(self.blocks)
        for seq in live:
            assert len(set(seq.block_table)) == len(seq.block_table), "a block twice in one table"
            for block_id in seq.block_table:
                counts[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == counts[block.block_id], (block.block_id, block.ref_count, counts[block.block_id])
            assert (block.ref_count == 0) == (block.block_id in self.free)
        for h, block_id in self.hash_to_block.items():
            assert self.blocks[block_id].hash == h
