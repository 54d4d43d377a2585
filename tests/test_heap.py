"""The C heap's free chunks, taken by the warm dispatcher before it forks (ops/run/heap.py), so
that a run_job's allocations land on pages of its own instead of in holes on pages every
child shares. Each test runs in a fresh interpreter: its heap is the test's to shape."""

import json
import subprocess
import sys
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


def shaped_heap(mode: str) -> dict:
    return run_in_a_fresh_interpreter(HOLES.replace("sys.argv[1]", repr(mode)))


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


# Holes of every size the per-thread cache keeps: taking a bin's chunk moves the rest of its
# bin into that cache, which malloc_info does not list.
CACHED_SIZES = """
import json
from ops.run import heap
libc = heap._glibc()
holes = set()
for size in range(24, 1100, 16):
    chunks = [libc.malloc(size) for _ in range(40)]
    for chunk in chunks[::2]:
        libc.free(chunk)
        holes.add(chunk)
taken = heap.take_free_chunks()
later = [libc.malloc(size) for size in range(24, 1100, 16) for _ in range(30)]
print(json.dumps({"taken": taken, "in_holes": len(holes & set(later))}))
"""

# Holes of many sizes in one bin (glibc's large bins hold a range of sizes): taken by the
# bin's smallest, so that no request is larger than a hole it could take.
WIDE_BIN = """
import json, re
from ops.run import heap
libc = heap._glibc()
def reserved():  # the main heap's size and what malloc holds in mmap'd chunks
    info = heap._malloc_info(libc)
    heap_size = re.search(r'<system type="current" size="(\\d+)"/>', info).group(1)
    mmapped = re.search(r'<total type="mmap" count="\\d+" size="(\\d+)"/>', info).group(1)
    return int(heap_size) + int(mmapped)
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


def run_in_a_fresh_interpreter(script: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.mark.process
def test_holes_the_per_thread_cache_would_hand_out_are_taken_too():
    result = run_in_a_fresh_interpreter(CACHED_SIZES)
    assert result["taken"] >= 1340
    assert result["in_holes"] == 0


@pytest.mark.process
def test_a_bin_of_many_sizes_is_taken_whole_without_growing_the_heap():
    result = run_in_a_fresh_interpreter(WIDE_BIN)
    assert result["free_before"] >= 100 * 33_000
    assert result["free_after"] <= result["free_before"] // 100
    assert result["grown"] <= 64 * 1024, result  # a page or so for the bookkeeping, not a bin


MAIN_HEAP = """<malloc version="1"><heap nr="0"><sizes>
  <size from="33" to="33" total="330" count="10"/>
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
def taken(monkeypatch) -> list[int]:
    """The take's list of held chunks, fresh, so that a fake's addresses stay in no one's."""
    fresh: list[int] = []
    monkeypatch.setattr(heap, "_taken", fresh)
    return fresh


def test_malloc_failing_part_way_keeps_what_was_taken_and_raises_nothing(monkeypatch, taken):
    monkeypatch.setattr(heap, "_malloc_info", lambda libc: MAIN_HEAP.format(heap_size=135168))
    libc = FakeLibc(room=100)
    assert heap.take_free_chunks(libc=libc) == 100
    assert len(taken) == 100


def test_a_bin_is_asked_for_by_its_smallest_chunk_and_its_count(monkeypatch, taken):
    monkeypatch.setattr(heap, "_malloc_info", lambda libc: MAIN_HEAP.format(heap_size=135168))
    libc = FakeLibc(room=10_000)
    heap.take_free_chunks(libc=libc, passes=1)
    from_bins = libc.asked[len(heap.TCACHE_SIZES) * heap.TCACHE_COUNT :][:14]
    assert from_bins == [32 - 8] * 10 + [1040 - 8] * 4  # never the bin's mean (1065)


def test_an_allocator_preloaded_in_glibcs_place_is_left_alone(monkeypatch, taken):
    """jemalloc or tcmalloc through LD_PRELOAD: glibc's malloc_info then describes a main heap
    no one uses; nothing is asked of malloc."""
    monkeypatch.setattr(heap, "_malloc_info", lambda libc: MAIN_HEAP.format(heap_size=0))
    libc = FakeLibc(room=10_000)
    assert heap.take_free_chunks(libc=libc) == 0
    assert libc.asked == [] and taken == []


def test_a_tuned_per_thread_cache_is_emptied_to_its_tuned_count(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.check=0:glibc.malloc.tcache_count=20")
    assert heap.tcache_count() == 20
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=65535")
    assert heap.tcache_count() == 127  # bounded: 64 sizes of it are asked for twice
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert heap.tcache_count() == 7


def test_without_glibcs_malloc_info_nothing_is_taken_and_nothing_fails(taken):
    class Musl:  # a libc without malloc_info
        def malloc(self, size):
            return 4096

    assert heap.take_free_chunks(libc=Musl()) == 0
    assert taken == []


def test_off_linux_there_is_no_glibc_to_ask(monkeypatch, taken):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert heap._glibc() is None
    assert heap.take_free_chunks() == 0
