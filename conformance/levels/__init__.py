"""The three checking levels, each with its harness and its clause tests together: store (the store
protocol), connector (a connector driven through vLLM's hooks), engine (a real vLLM)."""
