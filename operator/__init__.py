"""The control plane: kopf handlers, resource models, manifest builders, rebalancer."""
