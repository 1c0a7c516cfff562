"""Data parallelism under torchrun (FSDP2 or DDP) and the sharded checkpoints it writes."""
