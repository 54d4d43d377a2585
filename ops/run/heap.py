"""The C heap's free chunks, taken by the warm dispatcher before it forks (ops/run/dispatch.py).

A forked process shares its parent's pages until it writes one; the kernel then copies that
page for it alone. glibc's malloc serves a process's allocations from the free chunks first:
in a child of the dispatcher, those are the holes the dispatcher's start-up left scattered
across its heap, each on a page shared with every other child. A run_job's first database
connection (SQLite's schema, its statements), the interpreter's larger objects: each small
allocation in such a hole costs the child a whole 4 KiB copy. A raw SQLite connection and
one query cost a forked child ~1.5 MB that way; a dispatched no-op job ~2.2 MB (its run_job
and its job's child; bench/RESULTS.md, the dispatcher section).

Taken here, once, by the main thread, and never freed (a few hundred KiB of chunks on pages
already resident and never written again), those holes are out of reach: the main thread's
allocations in a child come from the top of the heap, onto pages of its own, densely. The
take asks malloc for no more than the free chunks it lists, and one chunk a size of the top.
Best effort, never an error: glibc's malloc_info tells the free chunks; elsewhere (musl,
macOS, an allocator preloaded in glibc's place, a thread's own arena) nothing is taken, and a
failure part-way keeps what was taken until then.
"""

import contextlib
import re
import sys
import threading

CACHED_SIZES = range(24, 1040, 16)  # the requests glibc's per-thread cache keeps, unlisted
MAX_CHUNKS = 50_000  # bounds the work on a heap that is one huge sieve...
MAX_CACHED = 65_535  # ...and on one size of the per-thread cache (7 by default, tunable to this)
_BIN = re.compile(r'<(?:size|unsorted) from="(\d+)" to="(\d+)" total="(\d+)" count="(\d+)"/>')
_SYSTEM = re.compile(r'<system type="current" size="(\d+)"/>')

held = 0  # chunks taken: held for the life of the process (their addresses are not kept)


def take_free_chunks(libc=None, passes: int = 2) -> int:
    """Allocate (and keep) the main heap's free chunks; returns how many were taken. `passes`:
    a free chunk larger than its bin's smallest is split by what takes it, its remainder
    listed again."""
    global held
    before = held
    if threading.current_thread() is not threading.main_thread():
        return 0  # a thread allocates from an arena of its own
    with contextlib.suppress(Exception):  # a saving, never a reason for a job not to start
        libc = libc if libc is not None else _glibc()
        listing = _main_heap(libc) if libc is not None else ""
        if not _glibc_heap(listing):
            return 0
        for done in range(passes):
            for chunk, count in _bins(listing if done == 0 else _main_heap(libc)):
                _take(libc, chunk, min(count, MAX_CHUNKS - (held - before)))
        # The per-thread cache (and what taking a bin's chunk moved into it from the rest of its
        # bin): each size until malloc answers from the top of the heap.
        top = _top_start(libc)
        for size in CACHED_SIZES:
            _take(libc, size + 8, min(MAX_CACHED, MAX_CHUNKS - (held - before)), top=top)
    return held - before


def _take(libc, chunk: int, count: int, top: int | None = None) -> None:
    """Up to `count` chunks of `chunk` bytes; with `top`, up to the first from the top."""
    global held
    for _ in range(count):
        address = libc.malloc(chunk - 8)  # 8: the chunk's header
        if not address:  # out of memory: what is taken stays taken
            raise MemoryError
        held += 1
        if top is not None and address >= top:
            return


def free_chunks(libc=None) -> list[tuple[int, int]]:
    """(chunk size, count) for each bin of the main heap that holds free chunks, as glibc's
    malloc_info() reports them; a bin of several sizes by its smallest, so that taking `count`
    of that size never asks for more than the bin holds."""
    libc = libc if libc is not None else _glibc()
    return _bins(_main_heap(libc)) if libc is not None else []


def _bins(main_heap: str) -> list[tuple[int, int]]:
    found = []
    for smallest, largest, total, count in _BIN.findall(main_heap):
        if int(count):
            # A fast bin's `from` is its size - 15, a bin's its smallest with the low bit set.
            same = int(total) == int(largest) * int(count)
            found.append((max(32, int(largest if same else smallest) & ~15), int(count)))
    return found


def free_bytes(libc=None) -> int:
    """The bytes of the main heap's free chunks (the per-thread cache's aside), at least."""
    return sum(chunk * count for chunk, count in free_chunks(libc))


def _glibc_heap(main_heap: str) -> bool:
    """Whether glibc's malloc serves this process (its main heap holds anything at all)."""
    system = _SYSTEM.search(main_heap)
    return bool(system and int(system.group(1)))


def _main_heap(libc) -> str:
    return _malloc_info(libc).split('<heap nr="0">', 1)[-1].split("</heap>", 1)[0]


def _top_start(libc) -> int:
    """Where the main heap's top chunk (its never used rest, up to the program break) begins:
    a chunk at or above it came from the top, not from a hole."""
    return libc.sbrk(0) - libc.mallinfo2().keepcost


def _malloc_info(libc) -> str:
    import ctypes

    buffer, size = ctypes.c_void_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size))
    if not stream:
        raise OSError("open_memstream failed")
    try:
        libc.malloc_info(0, stream)
    finally:
        libc.fclose(stream)
    if not buffer.value:
        return ""
    try:
        return ctypes.string_at(buffer.value, size.value).decode("ascii", "replace")
    finally:
        libc.free(buffer)


def _glibc():
    """libc's functions this module calls, typed; None where one is missing (mallinfo2 and
    malloc_info: glibc 2.33 and later)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
            "keepcost".split()
        ]

    try:
        libc = ctypes.CDLL(None)
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        for name, restype, argtypes in (
            ("malloc", pointer, [size]),
            ("free", None, [pointer]),
            ("open_memstream", pointer, [pointer, pointer]),
            ("malloc_info", ctypes.c_int, [ctypes.c_int, pointer]),
            ("fclose", ctypes.c_int, [pointer]),
            ("mallinfo2", Mallinfo2, []),
            ("sbrk", pointer, [ctypes.c_ssize_t]),
        ):
            function = getattr(libc, name)
            function.restype, function.argtypes = restype, argtypes
    except (AttributeError, OSError):
        return None
    return libc
