"""A node of a cluster: the peer tier assembled in the daemon (docs/cluster.md).

:class:`Cluster` is what ``[cluster]`` adds to a daemon: this node's NIXL agent over its
DRAM arena and a set of landing buffers per peer (``kvfs.mount.nixl_agent``), the peer
channel it serves
(``kvfs.mount.peer_server``), the links it reads through (``kvfs.mount.peer_link``),
the watch of its peers' KV events (``kvfs.mount.peer_events``), and the store's
:class:`~kvfs.peers.PeerReads` that uses them. Everything runs in threads of its own,
never on the trio loop. Opened before the mount (a bad address mounts nothing) and
closed after the loop ends, before the store.
"""

from __future__ import annotations

import logging
import os
import secrets

from kvfs.config import ClusterConfig
from kvfs.errors import KvfsError
from kvfs.peers import PeerIndex, PeerReads
from kvfs.stats import PeerStatistics
from kvfs.store import Store

__all__ = ["Cluster"]

log = logging.getLogger("kvfs.peers")

_MAX_LANDING = 16  # landing buffers in all, at most (each [cluster] landing bytes), and at least one per peer


class Cluster:
    """The peer tier of *store* for *config* (see the module doc)."""

    def __init__(self, store: Store, config: ClusterConfig) -> None:
        from .nixl_agent import Landing, NixlAgent
        from .peer_events import PeerWatch
        from .peer_link import MAX_LINKS, NixlPeers
        from .peer_server import PeerServer

        tier = store.slots[0].tier
        if not tier.reservable:
            raise KvfsError("[cluster] needs a dram tier first: peers read into and serve from the arena")
        self.config = config
        self.store = store
        per_peer = max(1, min(MAX_LINKS, _MAX_LANDING // max(1, len(config.peers))))
        landings = {p.name: Landing(config.landing, per_peer) for p in config.peers}
        fd = tier.share(True)
        try:
            size = os.fstat(fd).st_size
            name = f"{config.node}-{os.getpid()}-{secrets.token_hex(3)}"  # peers check this form
            self.agent = NixlAgent(name, fd, size, landings, ucx_tls=config.ucx_tls)
        except BaseException:
            for landing in landings.values():
                landing.close()
            raise
        finally:
            os.close(fd)
        self.index = PeerIndex(p.name for p in config.peers)
        self.links = NixlPeers(config, self.agent)
        self.reads = PeerReads(
            store.catalog, store.placement, store.ingest, self.index, self.links, timeout=config.timeout
        )
        self.server = PeerServer(store, config, agent=self.agent, counters=self.reads.counters)
        try:
            self.watch = PeerWatch(config, self.index, self.links.holdings)
        except BaseException:
            self.server.close()
            raise
        store.elsewhere.peers = self.reads
        log.info(
            "cluster node %s: peer channel on %s, peers %s",
            config.node,
            config.listen,
            ", ".join(f"{p.name}@{p.address}" for p in config.peers) or "none",
        )

    def statistics(self) -> tuple[PeerStatistics, ...]:
        return self.reads.statistics()

    def close(self) -> None:
        self.store.elsewhere.peers = None
        self.watch.close()
        self.server.close()
        self.links.close()
        self.agent.close()
        for landing in self.agent.landings.values():
            landing.close()
