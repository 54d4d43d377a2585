# Kept at the path users import (docs/several-servers.md): the claim itself is ops/run/claims.py.
from .run.claims import HeldClaim, current_claim

__all__ = ["HeldClaim", "current_claim"]
