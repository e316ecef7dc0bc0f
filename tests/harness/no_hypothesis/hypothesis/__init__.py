"""Stands in for Hypothesis in the kafscale processes the harness starts (``harness.children``).

kio imports ``hypothesis.strategies`` whenever it can and then registers a strategy for each of
its types: ~80-120 ms of CPU per broker, proxy or CLI process, several hundred of which a suite
run starts. None of them runs a property test, and kio goes without Hypothesis when its import
fails, as it does in a production install.
"""

raise ImportError("Hypothesis is kept out of processes started by tests/harness")
