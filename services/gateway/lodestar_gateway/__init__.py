"""Gateway service: vendor-API HTTP proxy, session capture and the node lifecycle that runs harnesses."""
