"""Notebook 11, the block manager: paged KV slots, lookahead, and the slot mapping.

The KV cache is one pool of ``num_blocks * block_size`` slots per layer. A request owns a
**block table**, the list of its blocks in order: its token at position ``pos`` lives in
block ``table[pos // block_size]`` at offset ``pos % block_size``, i.e. in slot
``table[pos // block_size] * block_size + pos % block_size``. Free blocks sit in one
shared list. Reference solutions of the exercises in ``grader/source/11_serving``.
"""

from __future__ import annotations

import torch

from specdec.validate import check_positive_int


def blocks_for(num_slots: int, block_size: int) -> int:
    """How many blocks hold ``num_slots`` slots (ceil division)."""
    return -(-num_slots // block_size)


def check_table_args(free_blocks: list[int], block_table: list[int], num_slots: int, block_size: int) -> None:
    check_positive_int(block_size, "block_size")
    check_positive_int(num_slots, "the number of slots", minimum=0)
    if not isinstance(free_blocks, list) or not isinstance(block_table, list):
        raise TypeError("free_blocks and block_table must be lists of block ids (they are changed in place)")


def reserve_slots(free_blocks: list[int], block_table: list[int], num_slots: int, block_size: int) -> bool:
    """Grow ``block_table`` in place until it covers slots 0..num_slots-1 of its request.

    New blocks are taken with ``free_blocks.pop()`` (the end of the free list). All or
    nothing: if the free list has too few blocks, change nothing and return False. A table
    that already covers ``num_slots`` is left as it is (never shrunk). Returns True on success.
    """
    check_table_args(free_blocks, block_table, num_slots, block_size)
    ### BEGIN SOLUTION
    missing = blocks_for(num_slots, block_size) - len(block_table)
    if missing > len(free_blocks):
        return False
    for _ in range(max(missing, 0)):
        block_table.append(free_blocks.pop())
    return True
    ### END SOLUTION


def release_slots(free_blocks: list[int], block_table: list[int], num_kept: int, block_size: int) -> None:
    """Shrink ``block_table`` in place to the blocks that hold slots 0..num_kept-1 and append
    every other block of it to ``free_blocks`` (``num_kept = 0`` frees them all). Each block is
    returned exactly once; a table that is already short enough is left as it is."""
    check_table_args(free_blocks, block_table, num_kept, block_size)
    ### BEGIN SOLUTION
    while len(block_table) > blocks_for(num_kept, block_size):
        free_blocks.append(block_table.pop())
    ### END SOLUTION


def check_mapping_args(block_tables: list[list[int]], starts: list[int], counts: list[int], block_size: int) -> None:
    check_positive_int(block_size, "block_size")
    if not len(block_tables) == len(starts) == len(counts):
        raise ValueError(f"one start and one count per block table: got {len(block_tables)} tables, "
                         f"{len(starts)} starts, {len(counts)} counts")
    for b, (table, start, count) in enumerate(zip(block_tables, starts, counts)):
        check_positive_int(start, f"starts[{b}]", minimum=0)
        check_positive_int(count, f"counts[{b}]", minimum=0)
        if blocks_for(start + count, block_size) > len(table):
            raise ValueError(f"row {b} writes positions {start}..{start + count - 1}, which need "
                             f"{blocks_for(start + count, block_size)} blocks of {block_size}; its table has "
                             f"{len(table)}: reserve the slots first")


def slot_mapping(block_tables: list[list[int]], starts: list[int], counts: list[int], block_size: int) -> torch.Tensor:
    """The KV slot of every new token of a ragged batch: (sum(counts),) int64, row after row.

    Row b writes ``counts[b]`` new tokens at positions ``starts[b] .. starts[b] + counts[b] - 1``
    (``starts[b]`` is what its cache already holds); position ``pos`` goes to slot
    ``block_tables[b][pos // block_size] * block_size + pos % block_size``.
    """
    check_mapping_args(block_tables, starts, counts, block_size)
    ### BEGIN SOLUTION
    slots = []
    for table, start, count in zip(block_tables, starts, counts):
        positions = torch.arange(start, start + count)
        blocks = torch.tensor(table, dtype=torch.long)[positions // block_size]
        slots.append(blocks * block_size + positions % block_size)
    return torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long)
    ### END SOLUTION
