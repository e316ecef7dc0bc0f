"""Client quotas (KIP-55, KIP-124, KIP-546): entities, their storage, and enforcement."""
