"""The lease-aware proxy (a later issue)."""
