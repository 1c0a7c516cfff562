"""GatewayService over gRPC (thin transport): sessions and captured calls of this node."""

from __future__ import annotations

from typing import Any, Protocol

import grpc.aio

from lodestar.errors import InvalidArgumentError
from lodestar.sampling import validate_policy
from lodestar.v1 import gateway_pb2, gateway_pb2_grpc
from lodestar_gateway.capture import CaptureStore
from lodestar_gateway.proxy import Proxy
from lodestar_gateway.sessions import SessionRegistry

Context = grpc.aio.ServicerContext[Any, Any]


class NodeInfo(Protocol):
    node_id: str

    @property
    def inference_target(self) -> str: ...

    @property
    def http_base_url(self) -> str: ...

    @property
    def capacity(self) -> int: ...

    def stage_counts(self) -> dict[str, int]: ...


def _public(session: gateway_pb2.Session) -> gateway_pb2.Session:
    """A session without its key (only OpenSession returns the key)."""
    copy = gateway_pb2.Session()
    copy.CopyFrom(session)
    copy.session_key = ""
    return copy


def _session_id(value: str) -> str:
    if not value:
        raise InvalidArgumentError("session_id is required")
    return value


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, node: NodeInfo, sessions: SessionRegistry, store: CaptureStore, proxy: Proxy) -> None:
        self._node = node
        self._sessions = sessions
        self._store = store
        self._proxy = proxy

    async def OpenSession(
        self, request: gateway_pb2.OpenSessionRequest, context: Context
    ) -> gateway_pb2.OpenSessionResponse:
        policy = request.sampling_policy if request.HasField("sampling_policy") else None
        if policy is not None:
            validate_policy(policy, "sampling_policy")
        entry = await self._sessions.open(run_id=request.run_id, labels=dict(request.labels), sampling_policy=policy)
        return gateway_pb2.OpenSessionResponse(session=entry.session, http_base_url=self._node.http_base_url)

    async def CloseSession(
        self, request: gateway_pb2.CloseSessionRequest, context: Context
    ) -> gateway_pb2.CloseSessionResponse:
        entry = await self._sessions.close(_session_id(request.session_id))
        self._proxy.chains.drop(entry.session_id)
        self._proxy.unanswered.pop(entry.session_id, None)
        return gateway_pb2.CloseSessionResponse(session=_public(entry.session))

    async def GetSession(
        self, request: gateway_pb2.GetSessionRequest, context: Context
    ) -> gateway_pb2.GetSessionResponse:
        entry = await self._sessions.find(_session_id(request.session_id))
        calls = await self._store.calls(entry.session_id)
        return gateway_pb2.GetSessionResponse(session=_public(entry.session), calls=calls)

    async def GetNodeStatus(
        self, request: gateway_pb2.GetNodeStatusRequest, context: Context
    ) -> gateway_pb2.GetNodeStatusResponse:
        return gateway_pb2.GetNodeStatusResponse(
            node_id=self._node.node_id,
            http_base_url=self._node.http_base_url,
            inference_target=self._node.inference_target,
            capacity=self._node.capacity,
            stage_counts=self._node.stage_counts(),
            open_sessions=self._sessions.open_count,
            calls_captured=self._proxy.calls_captured,
            chain_breaks=self._proxy.chain_breaks,
            branches=self._proxy.branches,
            unknown_fields=[
                gateway_pb2.UnknownFieldCount(dialect=dialect, field=name, count=count)
                for dialect, name, count in self._proxy.unknown_fields.counts()
            ],
        )
