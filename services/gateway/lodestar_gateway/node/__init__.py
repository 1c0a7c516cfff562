"""Gateway node: session lifecycle (INIT -> READY -> RUN -> POST), runtimes, verifiers and harness launchers."""
