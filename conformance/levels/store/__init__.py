"""The store level: the clause tests of the store protocol (any store, chosen by --kv-store)."""
