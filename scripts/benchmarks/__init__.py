"""efabuild's benchmark scenarios, one module each; `scripts/bench.py` runs them.

Every figure is a ratio against a baseline measured in the same run, on the same data and the
same machine: absolute times vary between machines, ratios much less.
"""
