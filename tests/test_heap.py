"""The C heap's free chunks, taken by the warm dispatcher before it forks (ops/run/heap.py), so
that a run_job's allocations land on pages of its own instead of in holes on pages every
child shares. Each test runs in a fresh interpreter: its heap is the test's to shape."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ops.run import heap

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(heap._glibc() is None, reason="glibc's malloc_info only")

# A heap with holes: 2,000 chunks of 200 bytes, every other one freed (their neighbours stay
# in use, so glibc cannot merge them).
HOLES = """
import json, sys
from ops.run import heap
libc = heap._glibc()
chunks = [libc.malloc(200) for _ in range(2000)]
holes = set(chunks[::2])
for chunk in chunks[::2]:
    libc.free(chunk)
free_before = heap.free_bytes()
taken = heap.take_free_chunks() if sys.argv[1] == "take" else 0
free_after = heap.free_bytes()
later = [libc.malloc(200) for _ in range(500)]
print(json.dumps({"taken": taken, "free_before": free_before, "free_after": free_after,
                  "in_holes": len(holes & set(later))}))
"""


def shaped_heap(mode: str, **env: str) -> dict:
    return run_in_a_fresh_interpreter(HOLES.replace("sys.argv[1]", repr(mode)), **env)


@pytest.mark.process
def test_allocations_after_the_take_land_in_none_of_the_holes_the_start_up_left():
    left = shaped_heap("leave")
    assert left["in_holes"] >= 400  # without it, malloc fills the holes first (the control)
    taken = shaped_heap("take")
    assert taken["taken"] >= 1000
    assert taken["in_holes"] == 0


@pytest.mark.process
def test_the_take_leaves_the_main_heap_almost_no_free_chunk():
    taken = shaped_heap("take")
    assert taken["free_before"] >= 1000 * 208  # the holes, as malloc_info lists them
    assert taken["free_after"] <= taken["free_before"] // 20


@pytest.mark.process
def test_holes_a_tuned_per_thread_cache_holds_are_taken_too():
    """glibc.malloc.tcache_count=2000: the 1,000 holes all sit in the per-thread cache, which
    malloc_info does not list; the take empties it to the top of the heap."""
    left = shaped_heap("leave", GLIBC_TUNABLES="glibc.malloc.tcache_count=2000")
    assert left["in_holes"] == 500  # the control
    assert left["free_before"] < 1000 * 208 // 4  # the holes sit in the cache, unlisted
    taken = shaped_heap("take", GLIBC_TUNABLES="glibc.malloc.tcache_count=2000")
    assert taken["in_holes"] == 0


# Holes of every size the per-thread cache keeps: taking a bin's chunk moves the rest of its
# bin into that cache.
CACHED_SIZES = """
import json, sys
from ops.run import heap
libc = heap._glibc()
holes = set()
for size in range(24, 1100, 16):
    chunks = [libc.malloc(size) for _ in range(40)]
    for chunk in chunks[::2]:
        libc.free(chunk)
        holes.add(chunk)
taken = heap.take_free_chunks() if sys.argv[1] == "take" else 0
later = [libc.malloc(size) for size in range(24, 1100, 16) for _ in range(30)]
print(json.dumps({"taken": taken, "in_holes": len(holes & set(later))}))
"""


@pytest.mark.process
def test_holes_the_per_thread_cache_would_hand_out_are_taken_too():
    left = run_in_a_fresh_interpreter(CACHED_SIZES.replace("sys.argv[1]", "'leave'"))
    assert left["in_holes"] >= 1000  # the control
    taken = run_in_a_fresh_interpreter(CACHED_SIZES.replace("sys.argv[1]", "'take'"))
    assert taken["in_holes"] == 0


RESERVED = """
import re
from ops.run import heap
libc = heap._glibc()
def reserved():  # the main heap's size and what malloc holds in mmap'd chunks
    info = heap._malloc_info(libc)
    heap_size = re.search(r'<system type="current" size="(\\d+)"/>', info).group(1)
    mmapped = re.search(r'<total type="mmap" count="\\d+" size="(\\d+)"/>', info).group(1)
    return int(heap_size) + int(mmapped)
"""

# Holes of many sizes in one bin (glibc's large bins hold a range of sizes): taken by the
# bin's smallest, so that no request is larger than a hole it could take.
WIDE_BIN = (
    RESERVED
    + """
import json
heap.take_free_chunks()  # a clean start: what follows comes from the top of the heap
chunks = []
for i in range(200):
    chunks.append(libc.malloc(33_000 + (i * 157) % 30_000))
    chunks.append(libc.malloc(100))  # in use: the holes stay apart
for chunk in chunks[::2]:
    libc.free(chunk)
free_before, reserved_before = heap.free_bytes(), reserved()
taken = heap.take_free_chunks()
print(json.dumps({"taken": taken, "free_before": free_before, "free_after": heap.free_bytes(),
                  "grown": reserved() - reserved_before}))
"""
)


def run_in_a_fresh_interpreter(script: str, **env: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.mark.process
def test_a_bin_of_many_sizes_is_taken_whole_without_growing_the_heap():
    result = run_in_a_fresh_interpreter(WIDE_BIN)
    assert result["free_before"] >= 100 * 33_000
    assert result["free_after"] <= result["free_before"] // 100
    assert result["grown"] <= 64 * 1024, result  # a page or so for the bookkeeping, not a bin


# A take with no hole left: what it asks of the top of the heap is one chunk of each size the
# per-thread cache keeps (~34 KiB), whatever that cache's tunable count.
AGAIN = """
import json
from ops.run import heap
libc = heap._glibc()
heap.take_free_chunks()
top = heap._top_start(libc)
heap.take_free_chunks()
print(json.dumps({"top_moved": heap._top_start(libc) - top}))
"""


@pytest.mark.process
@pytest.mark.parametrize("tunables", ["", "glibc.malloc.tcache_count=127"])
def test_a_take_with_no_hole_left_takes_little_from_the_top(tunables):
    result = run_in_a_fresh_interpreter(AGAIN, GLIBC_TUNABLES=tunables)
    assert 0 < result["top_moved"] <= 64 * 1024, result


MAIN_HEAP = """<malloc version="1"><heap nr="0"><sizes>
  <size from="33" to="48" total="144" count="3"/>
  <size from="49" to="49" total="490" count="10"/>
  <size from="1041" to="1089" total="4260" count="4"/>
</sizes><system type="current" size="{heap_size}"/></heap></malloc>"""


class FakeLibc:
    """glibc's malloc as the take sees it, with room for `room` more chunks."""

    def __init__(self, room: int) -> None:
        self.room, self.asked = room, []

    def malloc(self, size: int) -> int:
        if len(self.asked) >= self.room:
            return 0  # NULL: out of memory
        self.asked.append(size)
        return 4096 + 64 * len(self.asked)


@pytest.fixture
def fake_heap(monkeypatch):
    """A main heap of 135,168 bytes with 17 free chunks listed, whose top is below any chunk
    (each size of the per-thread cache: one malloc); `held` counted afresh."""
    monkeypatch.setattr(heap, "held", 0)
    monkeypatch.setattr(heap, "_top_start", lambda libc: 0)
    listing = {"heap_size": 135168}
    monkeypatch.setattr(heap, "_malloc_info", lambda libc: MAIN_HEAP.format(**listing))
    return listing


def test_a_bin_is_asked_for_by_its_smallest_chunk_and_a_fast_bin_by_its_size(fake_heap):
    libc = FakeLibc(room=10_000)
    assert heap.take_free_chunks(libc=libc, passes=1) == 17 + len(heap.CACHED_SIZES)
    # The fast bin of 48-byte chunks (from 33: 48 - 15), the bin of 48-byte chunks (49: its
    # low bit a flag), the bin of 1040-1088 bytes by its smallest, never its mean (1065).
    assert libc.asked[:17] == [48 - 8] * 3 + [48 - 8] * 10 + [1040 - 8] * 4
    assert libc.asked[17:] == [size for size in heap.CACHED_SIZES]  # each from the top


def test_malloc_failing_part_way_keeps_what_was_taken_and_raises_nothing(fake_heap):
    libc = FakeLibc(room=12)
    assert heap.take_free_chunks(libc=libc) == 12
    assert heap.held == 12


def test_the_take_is_bounded_on_a_heap_that_is_one_huge_sieve(fake_heap, monkeypatch):
    monkeypatch.setattr(heap, "MAX_CHUNKS", 15)
    libc = FakeLibc(room=10_000)
    assert heap.take_free_chunks(libc=libc) == 15
    assert len(libc.asked) == 15


def test_an_allocator_preloaded_in_glibcs_place_is_left_alone(fake_heap):
    """jemalloc or tcmalloc through LD_PRELOAD: glibc's malloc_info then describes a main heap
    no one uses; nothing is asked of malloc."""
    fake_heap["heap_size"] = 0
    libc = FakeLibc(room=10_000)
    assert heap.take_free_chunks(libc=libc) == 0
    assert libc.asked == []


def test_a_thread_takes_nothing_it_allocates_from_an_arena_of_its_own(fake_heap):
    libc, results = FakeLibc(room=10_000), []
    thread = threading.Thread(target=lambda: results.append(heap.take_free_chunks(libc=libc)))
    thread.start()
    thread.join()
    assert results == [0] and libc.asked == []


def test_a_failure_to_load_libc_is_no_error(fake_heap, monkeypatch):
    def out_of_memory():
        raise MemoryError  # `import ctypes` under the dispatcher's RLIMIT_AS, say

    monkeypatch.setattr(heap, "_glibc", out_of_memory)
    assert heap.take_free_chunks() == 0


def test_without_glibcs_malloc_info_nothing_is_taken_and_nothing_fails(monkeypatch):
    monkeypatch.setattr(heap, "held", 0)

    class Musl:  # a libc without malloc_info
        def malloc(self, size):
            return 4096

    assert heap.take_free_chunks(libc=Musl()) == 0
    assert heap.held == 0


def test_off_linux_there_is_no_glibc_to_ask(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert heap._glibc() is None
    assert heap.take_free_chunks() == 0
