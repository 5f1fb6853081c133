"""The batch client (placeholder while it is written)."""
