"""kvfs's own FUSE session layer on the kernel's protocol (``linux/fuse.h``).

- :mod:`.abi`: opcodes, flags and struct layouts of the protocol.
- :mod:`.device`: ``/dev/fuse``, mounting (``mount(2)`` or ``fusermount3``), its ioctls
  (clone, passthrough backing files).
- :mod:`.encode`: replies in the kernel's layouts; the READDIRPLUS buffer.
- :mod:`.dispatch`: one method per opcode, from request bytes to a handler call.
- :mod:`.session`: :class:`~.session.Session`, INIT and the request loop on trio.

It serves the same operations object as pyfuse3 (:class:`kvfs.mount.fs.KvfsOperations`);
:mod:`kvfs.mount.transport` chooses between the two. Written from the kernel's documented
interface; no code of libfuse or any other FUSE library is in it.
"""
