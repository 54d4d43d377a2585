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
    result = subprocess.run(
        [sys.executable, "-c", HOLES, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


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


def test_without_glibcs_malloc_info_nothing_is_taken_and_nothing_fails():
    class Musl:  # a libc without malloc_info (musl, macOS)
        def malloc(self, size):
            return 0

    assert heap.take_free_chunks(libc=Musl()) == 0
