"""lodestar: train unmodified coding-agent harnesses with GRPO.

The `lodestar` package is the shared kernel every service builds on: the generated contracts
(`lodestar.v1`), typed settings, structured logging, gRPC server/client helpers, the etcd wrapper and
the `lodestar` command line.
"""

__version__ = "0.1.0"
