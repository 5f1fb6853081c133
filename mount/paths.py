"""Where a mount's daemon can be reached: :mod:`kvfs.runtime`, re-exported for the daemon
and the tools (the core holds it so that :mod:`kvfs.client` needs no mount package)."""

from kvfs.runtime import (
    FSTYPE,
    RuntimeDirError,
    control_socket_path,
    find_mount,
    kvfs_mounts,
    log_path,
    mount_key,
    open_private,
    pid_path,
    read_private,
    real_path,
    runtime_dir,
    umount_report_path,
    unescape,
    write_private,
)

_key = mount_key  # the name older scripts and tests use

__all__ = [
    "FSTYPE",
    "RuntimeDirError",
    "control_socket_path",
    "find_mount",
    "kvfs_mounts",
    "log_path",
    "mount_key",
    "open_private",
    "pid_path",
    "read_private",
    "real_path",
    "runtime_dir",
    "umount_report_path",
    "unescape",
    "write_private",
]
