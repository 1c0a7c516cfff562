"""The application layer over the kernel and the four services: the `lodestar` CLI, the run dashboard and the
local stack. Nothing below it (the kernel `lodestar`, the services) imports it."""
