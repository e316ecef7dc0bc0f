"""The classic consumer group coordinator."""
