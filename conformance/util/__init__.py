"""Small shared utilities: child processes, version strings."""
