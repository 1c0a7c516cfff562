"""gRPC helpers shared by every service: server set-up, client channels, status mapping."""
