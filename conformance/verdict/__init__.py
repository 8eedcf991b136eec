"""What a verdict is: clauses as data, the asserts whose messages name them, the status lattice, the
watchdog that turns a hang into an Error, Hypothesis profiles, and the results document."""
