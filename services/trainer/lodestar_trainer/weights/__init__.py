"""Publishing the policy's weights to the inference replicas: the gRPC stream, the shared-filesystem and
torch.distributed transports, the replica set they publish to, and the push that overlaps the next step."""
