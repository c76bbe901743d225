"""One wake-up reader per API process: waiting costs a future, not a Redis connection.

Every push to a waiting call (grant, result, offline, cancelled ...) still lands in that
call's own wake list (`adm:{w:<id>}:wake:<entry>`, admission/queue.py): the list is the
durable part, and what `AsyncQueue.wait` returns is always popped from it. The scripts also
announce each push on the worker's sharded channel (`SPUBLISH adm:{w:<id>}:wake: <entry>`,
_common.lua `push_wake`). This reader subscribes, over one connection per Redis node, to the
channels of the workers this process has waiters for, and sets the waiter's event; the waiter
then pops its list with one short LPOP on the shared (bounded) command pool.

So the Redis connections of a process are constant: one subscriber per node plus the bounded
command pool, whatever the number of waiting calls. The channel carries the worker's hash tag,
so on Redis Cluster a script publishes to the node that owns the worker's slot (SPUBLISH from a
script must stay in the script's slot), and the reader keeps one subscriber connection per node
it has channels on (`node_of` below names the node; a standalone Redis is one node).

A notification is at most once (pub/sub): one lost while the subscriber reconnects, or during a
slot migration, is covered by two things. On every (re)subscription every waiter of that channel
is woken once to look at its list, and a waiter looks anyway every `SAFETY_LOOK_S` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("sluice.admission")

# A waiter pops its list at least this often even without a notification (a lost one).
SAFETY_LOOK_S = 5.0
# A channel stays subscribed this long after its last waiter left, so a worker with one call
# at a time does not cost a subscribe and an unsubscribe per call.
LINGER_S = 30.0
RECONNECT_BACKOFF_S = (0.05, 0.2, 0.5, 1.0)


@dataclass
class _Channel:
    node: str
    waiters: dict[str, set[asyncio.Event]] = field(default_factory=dict)
    subscribed: asyncio.Future[None] | None = None
    linger: asyncio.TimerHandle | None = None

    def count(self) -> int:
        return sum(len(events) for events in self.waiters.values())

    def wake_all(self) -> None:
        for events in self.waiters.values():
            for event in events:
                event.set()


class _Subscriber:
    """One pub/sub connection to one node, read by one task."""

    def __init__(self, reader: WakeReader, node: str, client: Any) -> None:
        self.reader, self.node, self.client = reader, node, client
        self.pubsub: Any = None
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.sharded = True

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def send(self, command: str, channel: str) -> None:
        await self.ready.wait()
        if command == "SSUBSCRIBE":
            await (self.pubsub.ssubscribe if self.sharded else self.pubsub.subscribe)(channel)
        else:
            await (self.pubsub.sunsubscribe if self.sharded else self.pubsub.unsubscribe)(channel)

    async def _sharded(self) -> bool:
        """Redis 7 has sharded pub/sub; on 6.2 (make run's embedded Redis) the scripts PUBLISH
        and this reader SUBSCRIBEs instead (one Redis, so nothing is lost by it)."""
        try:
            info = await self.client.info("server")
            return int(str(info.get("redis_version", "7")).split(".")[0]) >= 7
        except Exception:
            return True

    async def _run(self) -> None:
        attempt = 0
        while True:
            try:
                self.sharded = await self._sharded()
                self.pubsub = self.client.pubsub()
                # The connection is opened by the first command; subscribe to what is wanted
                # now (a reconnect resubscribes everything of this node).
                wanted = self.reader.channels_of(self.node) or [self.reader.idle_channel]
                if self.sharded:
                    await self.pubsub.ssubscribe(*wanted)
                else:
                    await self.pubsub.subscribe(*wanted)
                self.ready.set()
                attempt = 0
                while True:
                    message = await self.pubsub.get_message(timeout=None)
                    if message is not None:
                        self.reader.on_message(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.ready.clear()
                self.reader.on_lost(self.node)
                delay = RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)]
                attempt += 1
                # Expected while Redis restarts: one line, no traceback.
                log.warning(
                    "wake-up reader lost its Redis connection; reconnecting",
                    extra={"node": self.node, "error": str(exc)},
                )
                with contextlib.suppress(Exception):
                    await self.pubsub.aclose()
                await asyncio.sleep(delay)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if self.pubsub is not None:
            with contextlib.suppress(Exception):
                await self.pubsub.aclose()


class WakeReader:
    """Fans the wake notifications of every waiter of this process out to in-process events.

    `node_of(channel)` names the Redis node owning a channel and `client_for(node)` makes a
    client for it (connections.py: the one Redis, or a cluster's node).
    """

    def __init__(
        self,
        *,
        node_of: Callable[[str], str],
        client_for: Callable[[str], Any],
        idle_channel: str,
    ) -> None:
        self.node_of, self.client_for = node_of, client_for
        # A subscriber connection must subscribe to something to be one; this channel never
        # carries a message.
        self.idle_channel = idle_channel
        self.channels: dict[str, _Channel] = {}
        self.subscribers: dict[str, _Subscriber] = {}

    def channels_of(self, node: str) -> list[str]:
        return [name for name, ch in self.channels.items() if ch.node == node]

    def _subscriber(self, node: str) -> _Subscriber:
        subscriber = self.subscribers.get(node)
        if subscriber is None:
            subscriber = self.subscribers[node] = _Subscriber(self, node, self.client_for(node))
        subscriber.start()
        return subscriber

    @contextlib.asynccontextmanager
    async def watch(self, channel: str, entry_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set whenever something may have been pushed for `entry_id`.

        Subscribed before it is yielded, so a push made after the caller's next look at its
        list is never missed (apart from a lost connection, see the module note)."""
        ch = self.channels.get(channel)
        if ch is None:
            ch = self.channels[channel] = _Channel(node=self.node_of(channel))
        if ch.linger is not None:
            ch.linger.cancel()
            ch.linger = None
        event = asyncio.Event()
        ch.waiters.setdefault(entry_id, set()).add(event)
        try:
            await self._subscribed(channel, ch)
            if ch.subscribed is None or not ch.subscribed.done():
                # Not confirmed (a reconnecting subscriber): a push may go unannounced, so the
                # waiter looks at its list at once, and then every SAFETY_LOOK_S.
                event.set()
            yield event
        finally:
            events = ch.waiters.get(entry_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del ch.waiters[entry_id]
            if ch.count() == 0 and ch.linger is None:
                ch.linger = asyncio.get_running_loop().call_later(LINGER_S, self._drop, channel)

    async def _subscribed(self, channel: str, ch: _Channel) -> None:
        if ch.subscribed is None:
            ch.subscribed = asyncio.get_running_loop().create_future()
            subscriber = self._subscriber(ch.node)
            try:
                # Bounded: a subscriber that is reconnecting (or whose connection died without
                # a word) must not hold a waiter; the waiter then looks for itself.
                # (asyncio.timeout, not wait_for, which can swallow a cancel: queue.wait.)
                async with asyncio.timeout(SAFETY_LOOK_S):
                    await subscriber.send("SSUBSCRIBE", channel)
            except Exception:
                # The subscriber reconnects and resubscribes every wanted channel; until then
                # the waiter relies on its periodic look.
                ch.subscribed = None
                return
        # Never wait past a look interval for a confirmation that a lost connection ate (a
        # reconnect may also have reset it meanwhile: then the waiter looks for itself).
        confirmed = ch.subscribed
        if confirmed is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SAFETY_LOOK_S):
                await asyncio.shield(confirmed)

    def _drop(self, channel: str) -> None:
        ch = self.channels.get(channel)
        if ch is None or ch.count():
            return
        del self.channels[channel]
        subscriber = self.subscribers.get(ch.node)
        if subscriber is not None and subscriber.ready.is_set():
            task = asyncio.get_running_loop().create_task(subscriber.send("SUNSUBSCRIBE", channel))
            task.add_done_callback(lambda t: t.exception())

    def on_message(self, message: dict[str, Any]) -> None:
        kind, channel, data = message.get("type"), message.get("channel"), message.get("data")
        if isinstance(channel, bytes):
            channel = channel.decode()
        if isinstance(data, bytes):
            data = data.decode()
        ch = self.channels.get(str(channel))
        if ch is None:
            return
        # Plain pub/sub (Redis 6.2) names the same events without the s.
        kind = {
            "subscribe": "ssubscribe",
            "message": "smessage",
            "unsubscribe": "sunsubscribe",
        }.get(str(kind), kind)
        if kind == "ssubscribe":
            if ch.subscribed is not None and not ch.subscribed.done():
                ch.subscribed.set_result(None)
            # Pushes made before this subscription took effect were not announced.
            ch.wake_all()
        elif kind == "smessage":
            for event in ch.waiters.get(str(data), ()):
                event.set()
        elif kind == "sunsubscribe":
            # Redis drops a shard channel's subscribers when its slot moves to another node:
            # subscribe again, there.
            ch.subscribed = None
            ch.node = self.node_of(str(channel))
            ch.wake_all()
            if ch.count():
                task = asyncio.get_running_loop().create_task(self._subscribed(str(channel), ch))
                task.add_done_callback(lambda t: t.exception())

    def on_lost(self, node: str) -> None:
        for ch in self.channels.values():
            if ch.node == node:
                ch.subscribed = None
                ch.wake_all()

    def connection_count(self) -> int:
        return sum(1 for s in self.subscribers.values() if s.ready.is_set())

    async def close(self) -> None:
        for subscriber in self.subscribers.values():
            await subscriber.close()
        self.subscribers.clear()
        self.channels.clear()


def _dedicated(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A subscriber's connection settings: those of the command client, but it waits for
    messages indefinitely (a socket timeout would read as a broken connection) and keeps its
    own name (CLIENT LIST tells it from the command pool)."""
    keep = {
        k: v
        for k, v in kwargs.items()
        if k
        in (
            "host",
            "port",
            "username",
            "password",
            "db",
            "ssl",
            "ssl_ca_certs",
            "ssl_certfile",
            "ssl_keyfile",
            "ssl_cert_reqs",
            "client_name",
            "decode_responses",
            "path",
        )
    }
    keep.update(socket_timeout=None, socket_connect_timeout=1, socket_keepalive=True)
    if keep.get("client_name"):
        keep["client_name"] = f"{keep['client_name']}:wake"
    return keep


def reader_for(client: Any, *, idle_channel: str) -> WakeReader:
    """The reader for a command client: a plain Redis is one node; a cluster's channel lives on
    the node that owns its hash tag's slot, and that node gets a subscriber of its own."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    if isinstance(client, RedisCluster):

        def node_of(channel: str) -> str:
            node = client.get_node_from_key(channel)
            return f"{node.host}:{node.port}" if node is not None else "?"

        def client_for(node: str) -> Any:
            host, _, port = node.rpartition(":")
            kwargs = _dedicated(dict(client.connection_kwargs))
            kwargs.pop("path", None)
            kwargs.update(host=host, port=int(port))
            return aioredis.Redis(**kwargs)

        return WakeReader(node_of=node_of, client_for=client_for, idle_channel=idle_channel)

    kwargs = _dedicated(dict(client.connection_pool.connection_kwargs))
    if "path" in kwargs:
        kwargs["connection_class"] = aioredis.UnixDomainSocketConnection
    pool = aioredis.ConnectionPool(**kwargs)
    return WakeReader(
        node_of=lambda _channel: "redis",
        client_for=lambda _node: aioredis.Redis(connection_pool=pool),
        idle_channel=idle_channel,
    )
