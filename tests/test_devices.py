"""devices.keep_freed_memory: which blocks glibc maps (and so returns, and page-faults afresh) and which it keeps."""

import ctypes
import sys

import pytest
import torch

from contextual_bert.devices import keep_freed_memory

LARGE = 40 * 1024 * 1024  # above glibc's largest mmap threshold (32 MB), as an id table's gradient at 80k articles


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mapped_blocks() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2().hblks


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_training_maps_no_large_block_and_evaluation_maps_them_again():
    try:
        _mapped_blocks()
    except (OSError, AttributeError):
        pytest.skip("no glibc mallinfo2")
    try:
        keep_freed_memory(large_blocks=True)  # training
        before = _mapped_blocks()
        block = torch.empty(LARGE // 4)
        assert _mapped_blocks() == before  # from the heap, which keeps it once freed
        del block
        keep_freed_memory()  # evaluation: a large block is mapped (and returned when freed)
        before = _mapped_blocks()
        block = torch.empty(LARGE // 4)
        assert _mapped_blocks() == before + 1
        del block
        assert _mapped_blocks() == before
    finally:
        keep_freed_memory()
