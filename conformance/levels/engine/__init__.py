"""The engine level: a real vLLM with the connector under test, in child processes; its clause tests
compare against a no-connector baseline."""
