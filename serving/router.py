"""Ray Serve request router that sends every request of a session to the replica holding its KV cache.

Loaded by Ray Serve only (``RequestRouterConfig(request_router_class=...)``), which is why it may
import Ray at the top; nothing in vidgen imports it. The choice itself is in
:mod:`vidgen.serving.affinity`, which needs no Ray.

A session id is ``"<replica id>.<random hex>"``: the replica that opened the session names itself in
the id, so routing needs no shared table and every handle (the UI's, a proxy's, another
deployment's) routes the same way. The session id travels as the request's multiplexed model id
(``handle.options(multiplexed_model_id=session_id)``), which Serve passes to the router without
touching the arguments. Requests without a session (``open``) go to the least busy replica. If the
owning replica is gone (it crashed, or the deployment was scaled down), the session is sent to a
replica chosen by rendezvous hashing of the id over the live replicas -- the same one from every
handle -- which restores it from its persisted state if there is one.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from vidgen.serving.affinity import fallback_replica, owner_of


class SessionAffinityRouter(RequestRouter):
    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        session_id = pending_request.metadata.multiplexed_model_id if pending_request else ""
        if not session_id or not candidate_replicas:
            return [candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        owner = owner_of(session_id)
        if owner not in by_id:
            owner = fallback_replica(session_id, sorted(by_id))
        # Only that replica: when it is busy the request waits for it rather than going elsewhere.
        return [[by_id[owner]]]
