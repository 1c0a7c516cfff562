"""The run dashboard (`lodestar dashboard`): a read-only web UI over the rollout service and the trainer's
metrics. `source` reads (gRPC, metrics.jsonl), `shape` makes the JSON documents (pure), `server` serves
them with the static page under `static/` (plain JS; uPlot vendored from npm). See docs/dashboard.md."""
