"""The matrix: matrix.yaml's tiers, stacks and cells, the venvs that run them, and the runner."""
