"""The optimizer step's arithmetic: group-relative advantages, the policy forward pass (tree attention), the GRPO
loss, mixed precision, and the step's statistics and logprob mismatch."""
