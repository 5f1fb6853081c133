"""What the tests share besides fixtures (tests/README.md, "Layout").

Imported as ``from support.<module> import <name>`` (``pythonpath = ["tests"]`` in
pyproject.toml). One concept per module:

- ``deadlines``: how long a test waits (``DEADLINE``, ``ENGINE_DEADLINE``, ``TIER_TIMEOUT``,
  ``HANG``) and ``wait_for``.
- ``cli``: the ``kvfs`` command run with this interpreter (``KVFS``, ``run_kvfs``).
- ``mounts``: real FUSE mounts (``KvfsMounter`` behind the ``kvfs_mount`` fixture,
  ``fuse_missing``, ``TRANSPORTS``, ``with_transport``).
- ``configs``: config texts (``dram_over_disk``, ``DEFAULT_CONFIG``, ``TENANTS_CONFIG``).
- ``users``: real second users (``account``, the ``users`` fixture, ``run_as``).
- ``files``: plain file I/O on a mount (``blob``, ``err``, ``write``, ``renameat2``).
- ``stores``: a store over real tiers in this process (``make``, ``Clock``).
- ``client_procs``: batch clients in other processes (``Peer`` driving ``client_peer.py``).
- ``metrics``: scraping a daemon's Prometheus endpoint.
- harnesses: ``control_harness`` (a store behind a real control socket), ``engine_harness``
  (engine clients in their venvs), ``s3server`` (moto on 127.0.0.1, the ``moto`` fixture).
- scripts run as processes by path: ``client_peer.py``, ``zmq_peer.py``, ``stub_mount.py``.
"""

from pathlib import Path

SUPPORT_DIR = Path(__file__).resolve().parent
"""This folder, where the scripts run as processes live (``SUPPORT_DIR / "zmq_peer.py"``)."""
