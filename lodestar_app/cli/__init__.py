"""The `lodestar` command line: one module per command group, each exposing `register(subparsers)`."""
