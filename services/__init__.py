"""The four lodestar services: inference, gateway, rollout and trainer (one subpackage each)."""
