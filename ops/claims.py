# Kept at the path users import (docs/several-servers.md): they live in ops/run/fencing.py.
from .run.fencing import HeldClaim, current_claim

__all__ = ["HeldClaim", "current_claim"]
