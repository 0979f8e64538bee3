"""devices.keep_freed_memory: which blocks glibc maps (and so returns, and page-faults afresh) and which it keeps."""

import subprocess
import sys

import pytest

# In a fresh process: a heap that already holds a large free chunk would serve the block without mapping it either way.
CHECK = """
import ctypes, torch
from contextual_bert.devices import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
LARGE = 40 * 1024 * 1024 // 4  # floats: above glibc's largest mmap threshold (32 MB), as an id table's gradient

keep_freed_memory()  # evaluation: a large block is mapped (and returned when freed)
before = libc.mallinfo2().hblks
block = torch.empty(LARGE)
assert libc.mallinfo2().hblks == before + 1, "evaluation: the large block was not mapped"
del block
keep_freed_memory(large_blocks=True)  # training: from the heap, which keeps it once freed
before = libc.mallinfo2().hblks
block = torch.empty(LARGE)
assert libc.mallinfo2().hblks == before, "training: the large block was mapped"
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_training_maps_no_large_block_and_evaluation_maps_them():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    if "mallinfo2" in done.stderr and "AttributeError" in done.stderr:
        pytest.skip("no glibc mallinfo2")
    assert done.returncode == 0, done.stderr
