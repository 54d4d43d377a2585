"""Lets the fault scenarios import bench/_common.py (run them as `python bench/faults/fN_*.py`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
