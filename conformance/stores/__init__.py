"""Reference stores: correct implementations of the store protocol, shipped with the suite.

They are the suite's own control group: every clause must pass on them, and the known-bad
stores in ``conformance/zoo`` are small deviations from them.
"""
