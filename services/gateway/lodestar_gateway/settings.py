"""Settings of a gateway node (`lodestar gateway serve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from lodestar.settings import EtcdClientSettings


class GatewaySettings(EtcdClientSettings):
    section = "gateway"

    port: int = 50052
    http_host: str = "127.0.0.1"
    """Interface of the vendor-API HTTP port."""
    http_port: int = 8080
    """Vendor-API HTTP port (Anthropic, OpenAI Chat/Responses, Google); 0 picks a free one."""
    http_tls_cert: Path | None = None
    """PEM certificate of the HTTP port (HTTPS); without it a non-loopback --http-host logs a warning."""
    http_tls_key: Path | None = None
    """PEM private key of --http-tls-cert."""
    inference: str = "127.0.0.1:50051"
    """InferenceService address (host:port), or several replicas' addresses separated by commas: every call of
    a session then goes to one replica (consistent hashing with bounded load on the session id), and a
    replica that fails before a call's first token is skipped for the next (lodestar_gateway/replicas.py)."""
    inference_discovery: Literal["static", "etcd"] = "static"
    """Where the inference replicas come from: "static" = the addresses of --inference; "etcd" = the replicas
    registered in etcd (`lodestar inference serve --etcd`; needs --etcd), added and removed while the node runs
    (--inference is then unused): a replica is routed to once it serves the fleet's policy version, and sessions
    keep their replica while it lives (docs/deploy.md, "Scaling each tier")."""
    inference_load_factor: float = Field(default=1.25, ge=1.0)
    """Several replicas: the most calls one replica serves at once, as a multiple of the mean per replica,
    before a session's calls spill to the next replica on the ring."""
    rollout: str | None = None
    """RolloutService address: the node pulls sessions from it and runs them (needs --etcd); without it the
    node only proxies sessions opened by OpenSession."""
    etcd: str | None = None
    """etcd endpoint for node membership: https://host:port (TLS, --etcd-tls-*), or http://host:port on loopback
    (beyond it only with --etcd-allow-insecure); without it the node is not registered."""
    etcd_prefix: str = "/lodestar/"
    """Root of lodestar's etcd keys; the node registers as <prefix>nodes/<node_id>."""
    etcd_lease_ttl_s: int = 10
    """TTL of the node's etcd lease: a node that dies or is cut off vanishes from etcd after it."""
    node_id: str | None = None
    """Stable node id; defaults to hostname-pid."""
    data_dir: Path = Path(".lodestar/gateway")
    """Where the capture database (SQLite, WAL) lives."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Largest accepted HTTP request body; larger ones get 413 in the dialect's shape."""
    session_max_calls: int = Field(default=5000, ge=0)
    """Model calls one session may make, token counts included (then 429 in the dialect's shape; 0: no limit).
    Real agent sessions make tens to a few hundred; the bound stops an agent that loops on calls
    (services/gateway/lodestar_gateway/quotas.py)."""
    session_max_concurrent_calls: int = Field(default=16, ge=0)
    """Model calls of one session in flight at once (0: no limit)."""
    session_max_request_bytes: int = Field(default=8 * 1024**3, ge=0)
    """Request body bytes one session may send in all (0: no limit)."""
    relay_max_connections: int = Field(default=64, ge=1)
    """Connections one session's harness (or verifier) may hold open at once through the relay that forwards
    the gateway's port into its network namespace; one past it is closed as soon as it is accepted (each
    holds node file descriptors and a gateway connection)."""
    request_timeout_s: float = 600.0
    """Longest one model call may take end to end."""
    strict_fields: bool = False
    """Refuse unknown top-level request fields with 400 (as the vendors do) instead of accepting them (logged
    once per dialect and field, counted in GetNodeStatus.unknown_fields, kept in original_request_json)."""
    capture_synchronous: Literal["full", "normal", "off"] = "normal"
    """SQLite synchronous mode of the capture store: normal = a record committed before its response
    survives any crash of the gateway process; full = each commit is also fsynced (survives an OS crash or
    power loss, ~5 ms more per call)."""

    # Node lifecycle (with --rollout; see docs/nodes.md) ---------------------------------------------------
    slots: int = Field(default=4, ge=1)
    """Sessions whose harness runs at once (RUN stage)."""
    ready_buffer: int = Field(default=2, ge=0)
    """Prepared sessions waiting for a run slot (READY); the node holds up to slots + ready_buffer."""
    init_workers: int = Field(default=2, ge=1)
    """Sessions prepared at once (INIT: workspace, task files, gateway session)."""
    post_workers: int = Field(default=2, ge=1)
    """Sessions scored at once (POST: verifier, call collection)."""
    poll_interval_s: float = Field(default=1.0, gt=0)
    """AcquireSessions period (the node also polls at once when a run slot frees)."""
    sessions_dir: Path | None = None
    """Where session workspaces live (default <data_dir>/sessions); leftovers are removed at start."""
    session_root: Path = Path("/tmp/lodestar-session")
    """The fixed path every session sees its private directories at ({home,tmp,work}), via a bind mount in
    its own mount namespace; sessions see their real paths when mount namespaces are unavailable."""
    isolate_network: bool = True
    """Run harnesses in a loopback-only network namespace that reaches only this gateway (when possible)."""
    mount_namespaces: bool = True
    """Give sessions fixed paths through mount namespaces (when possible)."""
    host_sandbox: Literal["bwrap", "namespaces"] = "bwrap"
    """How the host runtime contains a session: "bwrap" (default) runs every process of it under bubblewrap
    (an allow-list root, user, PID, network, IPC, UTS and cgroup namespaces, seccomp, rlimits, never root
    outside: docs/security.md) and refuses sessions when bubblewrap cannot run; "namespaces" only gives each
    run its own network and mount namespaces (the whole host file system visible, the node's uid) and
    refuses a run when either cannot be made: for trusted agents only."""
    sandbox_hidden: list[Path] = Field(default_factory=list)
    """Host paths sessions must not see besides the node's data and sessions directories and the working
    directory's `.lodestar`. The sandbox's root is an allow-list, so they are outside it already unless they
    lie inside an installation it shows (the node's Python, the harness installs): there a directory is
    covered by an empty tmpfs and a file by an empty read-only file."""
    docker_mounts_allowed: list[Path] = Field(default_factory=list)
    """Host paths a docker run's `options.mounts` may name (each mount must resolve, symlinks followed, to one
    of them or below; `/` and the docker socket never). Empty (the default): a run asking for any mount fails
    its sessions on this node with PERMISSION_DENIED in the result."""
    harness_bin_dir: Path | None = None
    """Where the harness binaries are (default: <repo>/.harnesses/node_modules/.bin)."""
    default_model: str = "lodestar"
    """Model name harnesses are told to use when the run's HarnessSpec.model is empty."""
    default_session_timeout_s: float = Field(default=3600.0, gt=0)
    """Session limit when an assignment carries none."""
    default_agent_timeout_s: float = Field(default=1800.0, gt=0)
    """Agent (harness run) limit when an assignment carries none."""
    complete_attempts: int = Field(default=8, ge=1)
    """CompleteSession tries per result (exponential backoff 0.5 s .. 8 s) before it is given up."""
    shutdown_timeout_s: float = Field(default=15.0, gt=0)
    """On SIGTERM, how long killing and reporting in-flight sessions may take (after the drain grace)."""
    capture_retention_s: float = Field(default=600.0, ge=0)
    """How long a session this node ran stays in its capture store after rollout acknowledged its result
    (rollout's store then holds its calls); 0: deleted at the next sweep. Bounds the node's disk."""
    capture_retention_unacknowledged_s: float = Field(default=86_400.0, ge=0)
    """The same for a session whose result rollout never took (reporting gave up, or the node restarted
    while it ran): the node may hold the only copy of its calls."""
    capture_sweep_s: float = Field(default=60.0, gt=0)
    """How often expired sessions are deleted from the capture store."""
    drain_grace_s: float = Field(default=0.0, ge=0)
    """On SIGTERM, how long sessions whose harness or verifier is running may go on before the node hands
    them back (requeued elsewhere without spending an attempt); sessions not started yet go back at once.
    Keep drain_grace_s + shutdown_timeout_s below the orchestrator's kill deadline (Kubernetes:
    terminationGracePeriodSeconds)."""


SETTINGS = GatewaySettings
