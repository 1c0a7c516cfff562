"""From rollout groups to micro-batches: the typed samples and sequences, group intake, the builder per group,
splitting and packing; and seeded synthetic groups for tests and benchmarks."""
