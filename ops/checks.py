"""Django system checks for cronops configuration (ids ops.E0xx / ops.W0xx)."""
