"""The C heap's free chunks, taken by the warm dispatcher before it forks (ops/run/dispatch.py).

A forked process shares its parent's pages until it writes one; the kernel then copies that
page for it alone. glibc's malloc serves a process's allocations from the free chunks first:
in a child of the dispatcher, those are the holes the dispatcher's start-up left scattered
across its heap, each on a page shared with every other child. A run_job's first database
connection (SQLite's schema, its statements), the interpreter's larger objects: each small
allocation in such a hole costs the child a whole 4 KiB copy. A raw SQLite connection and
one query cost a forked child ~1.5 MB that way; a dispatched no-op job ~2.2 MB (its run_job
and its job's child; bench/RESULTS.md, the dispatcher section).

Taken here, once, and never freed (a few hundred KiB of chunks on pages already resident and
never written again), those holes are out of reach: a child's allocations come from the top of
the heap, onto pages of its own, densely. Best effort: glibc's malloc_info tells the free
chunks; elsewhere (musl, macOS), or on any error, nothing is taken.
"""

import re
import sys

TCACHE_SIZES = range(24, 1040, 16)  # glibc's per-thread cache: 64 sizes of request...
TCACHE_COUNT = 7  # ...of at most 7 chunks each, which malloc_info does not list
MAX_CHUNKS = 50_000  # bounds the work on a heap that is one huge sieve
_BIN = re.compile(r'<(?:size|unsorted) from="\d+" to="\d+" total="(\d+)" count="(\d+)"/>')

_taken: list[int] = []  # the chunks' addresses: held for the life of the process


def take_free_chunks(libc=None, passes: int = 2) -> int:
    """Allocate (and keep) the main heap's free chunks; returns how many were taken, 0 where
    malloc_info is unknown. `passes`: a large free chunk is split by what takes part of it,
    its remainder listed again."""
    libc = libc if libc is not None else _glibc()
    if libc is None:
        return 0
    try:
        before = len(_taken)
        for size in TCACHE_SIZES:
            _taken.extend(libc.malloc(size) for _ in range(TCACHE_COUNT))
        for _ in range(passes):
            for chunk, count in free_chunks(libc):
                count = min(count, MAX_CHUNKS - (len(_taken) - before))
                _taken.extend(libc.malloc(chunk - 8) for _ in range(count))  # 8: its header
        return len(_taken) - before
    except (AttributeError, OSError, ValueError):
        return 0


def free_chunks(libc=None) -> list[tuple[int, int]]:
    """(chunk size, count) for each bin of the main heap that holds free chunks, as glibc's
    malloc_info() reports them (a bin of several sizes: their mean)."""
    libc = libc if libc is not None else _glibc()
    if libc is None:
        return []
    main = _malloc_info(libc).split('<heap nr="0">', 1)[-1].split("</heap>", 1)[0]
    found = []
    for total, count in _BIN.findall(main):
        if int(count):
            chunk = max(32, int(total) // int(count)) & ~15  # glibc's 16-byte alignment
            found.append((chunk, int(count)))
    return found


def free_bytes(libc=None) -> int:
    """The bytes of the main heap's free chunks (the per-thread cache's aside)."""
    return sum(chunk * count for chunk, count in free_chunks(libc))


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
    """libc's functions this module calls, typed; None where malloc_info is missing."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        for name, restype, argtypes in (
            ("malloc", pointer, [size]),
            ("free", None, [pointer]),
            ("open_memstream", pointer, [pointer, pointer]),
            ("malloc_info", ctypes.c_int, [ctypes.c_int, pointer]),
            ("fclose", ctypes.c_int, [pointer]),
        ):
            function = getattr(libc, name)
            function.restype, function.argtypes = restype, argtypes
    except (AttributeError, OSError):
        return None
    return libc
