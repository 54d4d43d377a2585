# Kept at the path users import (docs/several-servers.md): they live in ops/run/fencing.py
# and ops/run/held.py.
from .run.fencing import current_claim
from .run.held import HeldClaim

__all__ = ["HeldClaim", "current_claim"]
