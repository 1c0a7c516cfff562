"""Rollout service: runs, pull-based session scheduling over gateway nodes, durable store, groups."""
