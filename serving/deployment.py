"""Serving many users with Ray Serve: N pipeline replicas holding sessions, with cache-aware routing.

Who calls whom::

    vidgen serve --backend ray (Gradio page) --> RaySessions  --handle-->  SessionReplica x N
                                                 (driver)      SessionAffinityRouter   (Serve replicas,
                                                                (session -> replica)  SessionManager each)

* :class:`SessionReplica` is a Serve deployment: each replica loads the pipeline once and holds
  sessions in a :class:`~vidgen.pipelines.session.SessionManager` (one KV cache per session), the
  same class the page's local backend runs in its own process.
  Its chunks are made on one compute thread, so the sessions of a replica take turns chunk by
  chunk while control calls (a new prompt, stop) are answered at once.
* Routing: the replica that opens a session puts its own replica id in the session id, and
  :class:`~vidgen.serving.router.SessionAffinityRouter` (the deployment's Serve request
  router) sends every later request of that session -- more chunks, more seconds, a new prompt,
  stop -- to that replica, whichever process holds the handle. New sessions go to the least busy
  replica.
* Eviction: a replica evicts sessions idle for ``idle_timeout_s``. With ``persist_dir`` (storage
  every replica can read) an evicted session is saved first and restored on its next request, so
  the video continues as if it had never stopped; it also survives the crash of its replica.
* Sequence parallelism (``sp > 1``): each replica is rank 0 of ``sp`` processes on one node (Serve
  reserves a bundle per rank), the others being follower actors it starts; every chunk of a session
  is made by all of them together, Ulysses or ring attention as ``runtime.sp_kind`` decides
  (:mod:`vidgen.serving.followers`). Persisted sessions keep one state file per rank.
* :class:`RaySessions` implements ``vidgen.pipelines.session.SessionBackend`` (``open``,
  ``chunks``, ``change_prompt``, ``stop``, plus ``info``, ``extend`` and ``replica_of``) over a
  deployment handle, for the Gradio page.

No HTTP proxy is started: the page talks to the deployment handle, so no port opens for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidgen.distributed.ray_worker import PipelineSpec
from vidgen.pipelines.session import GenerationRequest, RequestLimits, SessionNotFound

if TYPE_CHECKING:
    from vidgen.serving.followers import GroupSettings

ROUTER = "vidgen.serving.router:SessionAffinityRouter"
APP_NAME = "vidgen-sessions"


def _bind_replica_grpc_to_loopback() -> None:
    """Ray Serve replicas open an inter-deployment gRPC server on ``[::]:0`` (every interface),
    whatever the node address. On the private 127.0.0.1 cluster, bind it to loopback instead.

    Patches the name Ray's replica module calls; runs in the replica before Ray starts that
    server (the user constructor runs first). A no-op if Ray's internals differ.
    """
    try:
        from ray.serve._private import replica as serve_replica
    except ImportError:  # pragma: no cover
        return
    original = getattr(serve_replica, "add_port_to_grpc_server", None)
    if original is None or getattr(original, "vidgen_loopback", False):
        return

    def loopback_only(server, address: str):
        host, _, port = address.rpartition(":")
        if _is_wildcard(host):
            address = f"127.0.0.1:{port}"
        return original(server, address)

    loopback_only.vidgen_loopback = True
    serve_replica.add_port_to_grpc_server = loopback_only


def _is_wildcard(host: str) -> bool:
    """Whether ``host`` means "every interface" (empty, or the unspecified IPv4/IPv6 address)."""
    host = host.strip("[]")
    if not host:
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


class SessionReplica:
    """One serving replica (a Serve deployment class, wrapped by :func:`deployment`)."""

    def __init__(
        self,
        spec: PipelineSpec,
        persist_dir: str | None = None,
        idle_timeout_s: float = 600.0,
        check_every_s: float | None = None,
        loopback: bool = False,
        group_settings: GroupSettings | None = None,
        limits: RequestLimits | None = None,
        batch_sessions: int = 1,
        history_mb: float = 64.0,
        batch_lanes: int = 1,
    ) -> None:
        import os
        import uuid

        import torch
        from ray import serve

        from vidgen.pipelines.session import SessionManager

        if loopback:
            _bind_replica_grpc_to_loopback()
        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        pipe = spec.load()
        self.group: Any = None
        if group_settings is not None:  # this replica is rank 0 of sp; see vidgen.serving.followers
            from vidgen.serving.followers import ReplicaGroup

            self.group = ReplicaGroup.start(pipe, spec, group_settings)
        self.store = SessionManager(
            pipe,
            persist_dir=persist_dir,
            idle_timeout_s=idle_timeout_s,
            new_id=lambda: f"{self.replica_id}.{uuid.uuid4().hex}",
            streamer=self.group.leader if self.group is not None else None,
            limits=limits,
            # a group's ranks make one chunk at a time, in step: neither batched nor rewound
            batch_sessions=batch_sessions if self.group is None else 1,
            batch_lanes=batch_lanes,
            history_mb=history_mb if self.group is None else 0.0,
        )
        # compute threads: one chunk at a time, or as many as are batched together
        threads = batch_sessions * batch_lanes if self.store.batcher is not None else 1
        self.compute = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="vidgen-compute")
        self._closing = threading.Event()
        every = check_every_s if check_every_s is not None else max(0.05, min(idle_timeout_s / 4, 30.0))
        self._evictor = threading.Thread(target=self._evict_loop, args=(every,), daemon=True)
        self._evictor.start()

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.compute, fn, *args)

    # ------------------------------------------------------------------ requests
    async def open(self, request: GenerationRequest) -> str:
        return await self._run(self.store.open, request)

    async def chunks(self, session_id: str):
        """Stream the session's chunks until it is stopped or reaches its length. The first item is
        ``None``, sent at once: the caller learns the session exists before the first chunk is made."""
        self.store.begin_read(session_id)
        try:
            yield None
            while True:
                chunk = await self._run(self.store.next_chunk, session_id)
                if chunk is None:
                    return
                yield chunk
        finally:
            self.store.end_read(session_id)

    async def change_prompt(self, session_id: str, prompt: str) -> None:
        self.store.change_prompt(session_id, prompt)

    async def extend(self, session_id: str, seconds: float) -> None:
        self.store.extend(session_id, seconds)

    async def stop(self, session_id: str) -> None:
        await self._run(self.store.stop, session_id)

    async def rewind(self, session_id: str, seconds: float, prompt: str | None = None) -> float:
        return await self._run(self.store.rewind, session_id, seconds, prompt)

    async def fork(self, session_id: str, at_seconds: float, prompt: str | None = None) -> str:
        return await self._run(self.store.fork, session_id, at_seconds, prompt)

    async def history(self, session_id: str) -> dict[str, Any]:
        return self.store.history(session_id)

    async def holds(self, session_id: str) -> dict[str, Any]:
        """Which replica answered, and whether the session is live in its memory."""
        state = self.store.describe()
        return {"replica": self.replica_id, "live": session_id in state["sessions"]}

    async def stats(self) -> dict[str, Any]:
        """The replica's sessions; with sequence parallelism, its group's kind and its followers'
        own stats (process, chunks made, streams open)."""
        stats = {"replica": self.replica_id, **self.store.describe()}
        if self.group is not None:
            stats.update(await self.group.stats())
        return stats

    async def info(self):
        return self.store.info

    async def check_health(self) -> None:
        """Called by Serve every few seconds; a replica that fails it is replaced. With sequence
        parallelism, a replica whose follower died (its group is broken) fails it: the new replica
        restores persisted sessions."""
        if self.group is not None:
            await self.group.check()

    # ------------------------------------------------------------------ eviction
    def _evict_loop(self, every: float) -> None:
        while not self._closing.wait(every):
            for session_id in self.store.idle():
                # on the compute thread, never while one of its chunks is being made
                self.compute.submit(self.store.evict, session_id).result()

    def __del__(self) -> None:
        self._closing.set()
        self.store.close()
        if self.group is not None:
            self.group.close()


def deployment(
    spec: PipelineSpec,
    *,
    replicas: int = 1,
    persist_dir: str | Path | None = None,
    idle_timeout_s: float = 600.0,
    check_every_s: float | None = None,
    gpu: bool = False,
    cpus_per_replica: float = 1.0,
    max_sessions_per_replica: int = 16,
    loopback: bool = False,
    sp: int = 1,
    rendezvous_root: str | Path | None = None,
    limits: RequestLimits | None = None,
    batch_sessions: int = 1,
    history_mb: float = 64.0,
    batch_lanes: int = 1,
):
    """The bound Serve application: ``replicas`` copies of :class:`SessionReplica`, each one
    ``sp`` processes (the replica and ``sp - 1`` followers, on one node) with ``cpus_per_replica``
    CPUs (or a GPU) each; ``rendezvous_root``: where their groups meet (see ``GroupSettings``);
    ``limits``: each replica refuses requests beyond them at ``open``; ``batch_sessions``: sessions
    a replica steps at once, batched (:class:`~vidgen.pipelines.session.SessionManager`);
    ``history_mb``: the states each session keeps for rewind and fork."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from vidgen.distributed.ray_worker import worker_env

    options: dict[str, Any] = {
        "num_cpus": cpus_per_replica,
        "num_gpus": 1 if gpu else 0,
        "runtime_env": {"env_vars": worker_env(loopback)},
    }
    placement: dict[str, Any] = {}
    group = None
    if sp > 1:
        from vidgen.serving.followers import GroupSettings

        # one bundle per rank, on one node: the replica takes the first, its followers the others
        bundle = {"CPU": cpus_per_replica, **({"GPU": 1} if gpu else {})}
        placement = {"placement_group_bundles": [bundle] * sp, "placement_group_strategy": "STRICT_PACK"}
        group = GroupSettings(sp, options, str(rendezvous_root) if rendezvous_root else None)
    cls = serve.deployment(
        SessionReplica,
        name="SessionReplica",
        num_replicas=replicas,
        ray_actor_options=options,
        # a session being read holds one request for as long as it streams
        max_ongoing_requests=4 * max_sessions_per_replica,
        request_router_config=RequestRouterConfig(request_router_class=ROUTER),
        **placement,
    )
    persist = str(persist_dir) if persist_dir else None
    return cls.bind(
        spec,
        persist,
        idle_timeout_s,
        check_every_s,
        loopback,
        group,
        limits,
        batch_sessions,
        history_mb,
        batch_lanes,
    )


class RaySessions:
    """The ``SessionBackend`` protocol over Ray Serve replicas (see the module docstring)."""

    def __init__(
        self, handle, app_name: str = APP_NAME, owns_ray: bool = False, scratch: str | Path | None = None
    ) -> None:
        self.handle = handle
        self.app_name = app_name
        self._owns_ray = owns_ray
        self._scratch = scratch  # the replicas' rendezvous folders, removed by shutdown()
        self._info = None

    @classmethod
    def from_pretrained(
        cls,
        model: str | None = None,
        *,
        config: str | None = None,
        replicas: int | None = None,
        persist_dir: str | Path | None = None,
        idle_timeout_s: float = 600.0,
        check_every_s: float | None = None,
        address: str | None = None,
        overrides: dict[str, Any] | None = None,
        cpus_per_replica: float = 1.0,
        app_name: str = APP_NAME,
        sp: int = 1,
        sp_kind: str | None = None,
        limits: RequestLimits | None = None,
        batch_sessions: int = 1,
        history_mb: float = 64.0,
        batch_lanes: int = 1,
    ) -> RaySessions:
        """Deploy the pipeline (``model``, ``config``, ``overrides`` as in ``from_pretrained``) on
        ``replicas`` Serve replicas (None: one per ``sp`` GPUs, or one on a CPU-only cluster).

        ``sp``: processes per replica sharing each video's tokens (sequence parallelism);
        ``sp_kind``: ``"ulysses"``, ``"ring"`` or ``"auto"`` (None: the config's
        ``runtime.sp_kind``). A degree the model cannot run raises ``DegreeError`` before Ray starts.
        ``limits``: a server's bounds on one request, enforced by every replica.
        ``batch_sessions``: sessions each replica steps at once as one batched forward (1: in
        turns; with ``sp`` > 1 always in turns), ``batch_lanes`` such forwards at once; ``history_mb``: each session's states kept for
        :meth:`rewind` and :meth:`fork` (none with ``sp`` > 1).
        """
        from vidgen.distributed.ray_cluster import DegreeError, RayParallelism
        from vidgen.pipelines.loading import resolve_model

        RayParallelism(sp=sp)  # a positive integer
        overrides = {**(overrides or {}), **({"runtime.sp_kind": sp_kind} if sp_kind else {})}
        spec = PipelineSpec(model=model, config=config, overrides=overrides)
        resolve_model(model, None)  # a missing folder fails here, as ModelLoadError, not in a replica
        if sp > 1:
            from vidgen.serving.followers import check_serving_degree

            check_serving_degree(spec, sp)  # a degree the model cannot split fails here, not in a replica
        from ray import serve

        from vidgen.distributed.ray_cluster import connect, is_loopback_cluster, uses_gpus

        started = connect(address)
        gpu = uses_gpus()
        if replicas is None:
            import ray

            replicas = max(1, int(ray.cluster_resources().get("GPU", 0)) // sp) if gpu else 1
        if replicas < 1:
            raise DegreeError(f"replicas must be >= 1, got {replicas}")
        loopback = is_loopback_cluster()
        # replicas of a local cluster meet in this folder, which shutdown() removes (another node's
        # replica makes the same path there)
        scratch = tempfile.mkdtemp(prefix="vidgen-serve-") if sp > 1 else None
        # the page reaches the replicas through the handle: no HTTP proxy, no open port
        serve.start(proxy_location="Disabled", http_options={"host": "127.0.0.1"})
        app = deployment(
            spec,
            sp=sp,
            replicas=replicas,
            persist_dir=persist_dir,
            idle_timeout_s=idle_timeout_s,
            check_every_s=check_every_s,
            gpu=gpu,
            cpus_per_replica=cpus_per_replica,
            loopback=loopback,
            rendezvous_root=scratch,
            limits=limits,
            batch_sessions=batch_sessions,
            history_mb=history_mb,
            batch_lanes=batch_lanes,
        )
        handle = serve.run(app, name=app_name, route_prefix=None)
        return cls(handle, app_name, owns_ray=started == "local", scratch=scratch)

    # ------------------------------------------------------------------ SessionBackend
    def _session(self, session_id: str):
        return self.handle.options(multiplexed_model_id=session_id)

    @staticmethod
    def _result(response):
        try:
            return response.result()
        except SessionNotFound as err:  # re-raised plain, without Ray's wrapper
            raise SessionNotFound(*err.args) from None

    @property
    def info(self):
        """The model's :class:`~vidgen.pipelines.session.ModelInfo` (asked of a replica once)."""
        if self._info is None:
            self._info = self.handle.info.remote().result()
        return self._info

    def open(self, request: GenerationRequest) -> str:
        return self.handle.open.remote(request).result()

    def chunks(self, session_id: str) -> Iterator[Any]:
        """The session's chunks; raises :class:`SessionNotFound` here, not at the first chunk, as
        ``SessionManager.chunks`` does (the replica answers at once with a ``None`` header)."""
        stream = self._session(session_id).options(stream=True).chunks.remote(session_id)
        try:
            next(stream)
        except SessionNotFound as err:
            raise SessionNotFound(*err.args) from None
        return self._rest(stream)

    @staticmethod
    def _rest(stream) -> Iterator[Any]:
        try:
            yield from stream
        finally:
            stream.cancel()

    def change_prompt(self, session_id: str, prompt: str) -> None:
        self._result(self._session(session_id).change_prompt.remote(session_id, prompt))

    def stop(self, session_id: str) -> None:
        self._result(self._session(session_id).stop.remote(session_id))

    # ------------------------------------------------------------------ beyond the protocol
    def extend(self, session_id: str, seconds: float) -> None:
        """More seconds for a session that reached its length; read them with :meth:`chunks`."""
        self._result(self._session(session_id).extend.remote(session_id, seconds))

    def rewind(self, session_id: str, seconds: float, prompt: str | None = None) -> float:
        """As ``SessionManager.rewind``, on the session's replica."""
        return self._result(self._session(session_id).rewind.remote(session_id, seconds, prompt))

    def fork(self, session_id: str, at_seconds: float, prompt: str | None = None) -> str:
        """As ``SessionManager.fork``: the branch lives on the same replica (its id says which)."""
        return self._result(self._session(session_id).fork.remote(session_id, at_seconds, prompt))

    def history(self, session_id: str) -> dict[str, Any]:
        return self._result(self._session(session_id).history.remote(session_id))

    def replica_of(self, session_id: str) -> dict[str, Any]:
        """``{"replica": id, "live": bool}`` from the replica this session's requests reach."""
        return self._result(self._session(session_id).holds.remote(session_id))

    def shutdown(self) -> None:
        from ray import serve

        serve.delete(self.app_name)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if self._owns_ray:
            import ray

            ray.shutdown()
