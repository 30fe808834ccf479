"""A FUSE file system of files named like MPI libraries whose reads block: the file system of a
hung NFS or FUSE mount, for tests/attach.rs.

usage: hung_library.py MOUNT_POINT STARTED RELEASE FILE_NAME...

Lookups, attributes and opens are answered at once, so a process opens (and maps) a file as
usual. A read of FILE_NAME blocks until the file RELEASE-FILE_NAME exists; the first read creates
STARTED, so the test knows a reader is blocked. Runs in the foreground until unmounted.
"""

import errno
import os
import stat
import sys
import threading
import time

from fusepy import FUSE, FuseOSError, Operations

SIZE = 1 << 16


class HungLibrary(Operations):
    def __init__(self, names, started, release):
        # Attribute names other than the Operations' methods (open, read, release, lock...).
        self.paths = ["/" + name for name in names]
        self.started_marker = started
        self.release_marker = release
        self.first_read = threading.Lock()

    def getattr(self, path, fh=None):
        now = time.time()
        times = dict(st_atime=now, st_mtime=now, st_ctime=now)
        if path == "/":
            return dict(st_mode=stat.S_IFDIR | 0o755, st_nlink=2, **times)
        if path in self.paths:
            return dict(st_mode=stat.S_IFREG | 0o755, st_nlink=1, st_size=SIZE, **times)
        raise FuseOSError(errno.ENOENT)

    def readdir(self, path, fh):
        return [".", ".."] + [p[1:] for p in self.paths]

    def open(self, path, flags):
        if path not in self.paths:
            raise FuseOSError(errno.ENOENT)
        return 0

    def read(self, path, size, offset, fh):
        with self.first_read:
            if not os.path.exists(self.started_marker):
                open(self.started_marker, "w").close()
        while not os.path.exists(self.release_marker + "-" + path[1:]):
            time.sleep(0.05)
        return bytes(max(0, min(size, SIZE - offset)))


if __name__ == "__main__":
    mount_point, started, release = sys.argv[1:4]
    # Read-write, so that a process can open a file without the read-only open the daemon holds.
    FUSE(HungLibrary(sys.argv[4:], started, release), mount_point, foreground=True)
