"""Generated protobuf and gRPC code for package lodestar.v1 (`make proto`; never edited by hand)."""
