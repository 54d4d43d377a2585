"""Print one SHA-256 over a directory's files (names and contents), skipping excluded names.

Usage: tree_fingerprint.py ROOT [PATTERN ...]   (fnmatch patterns, matched against each
file and directory name, like rsync's --exclude for plain names)

The deploy keeps the fingerprint of the tree it last `pip install`-ed in the virtualenv and
installs again only when the tree's fingerprint differs.
"""

import fnmatch
import hashlib
import os
import sys


def fingerprint(root: str, skip: list[str]) -> str:
    def skipped(name: str) -> bool:
        return any(fnmatch.fnmatch(name, pattern) for pattern in skip)

    digest = hashlib.sha256()
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not skipped(d))
        for name in sorted(files):
            if skipped(name):
                continue
            path = os.path.join(here, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()


if __name__ == "__main__":
    print(fingerprint(sys.argv[1], sys.argv[2:]))
