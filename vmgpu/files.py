"""Host files: writing files that other programs read at any moment (libvirt's hooks, docker's
daemon.json, an OCI bundle's config.json): write beside, then rename over; and making and opening
vmgpu's own files so that no other local user can plant, replace or read them (private
directories, exclusive creation, owner checks, access for a guest's user by ACL)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import struct
from pathlib import Path

from vmgpu.errors import UnsafePath


def write_atomic(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """Replace path's content with text in one step; mode: set these permissions first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_beside(path, 0o644 if mode is None else mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    publish(tmp, path, replace=True)
    return path


# ---- files that other local users must not be able to plant, replace or read -----------------
# (DESIGN.md, the trust boundary: the host trusts only root)


def private_dir(path: str | os.PathLike, create: bool = True) -> Path:
    """path as a directory only this user can change: made 0700 if missing (create); refused if it
    is a link, not a directory, not ours, or writable by group or others."""
    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UnsafePath(f"{path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a directory (a symbolic link or a file): remove it; vmgpu makes it 0700")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UnsafePath(
            f"the directory {path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: refusing it; "
            f"it must be this user's (uid {os.geteuid()}) and writable by no one else (fix its owner and mode)"
        )
    return path


def check_trusted_dir(path: str | os.PathLike, where: str, why: str, last: bool = True) -> None:
    """path must be a real directory (no link) of root's or this user's that no one else can change:
    not writable by group or others, but for a sticky one such as /tmp above the last directory
    checked (last False: no one else can rename what is in it).  where: what path is, why: why it
    matters, for the message.  FileNotFoundError if it is missing."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} ({where}) is not a directory but a link or a file: {why}")
    writable = st.st_mode & 0o022 and (last or not st.st_mode & stat.S_ISVTX)
    if st.st_uid not in (0, os.geteuid()) or writable:
        raise UnsafePath(f"{path} ({where}) belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: {why}")


def check_path_above(path: str | os.PathLike, what: str) -> None:
    """Every directory above path, down from /, checked as check_trusted_dir says: otherwise
    someone could swap path for a directory of theirs after it was checked.  what: path's
    purpose, for the message."""
    for parent in reversed(Path(path).parents):
        check_trusted_dir(
            parent,
            f"above {what} {path}",
            "someone else could replace what is below it; it must be a real directory, root's and writable by "
            "no one else",
            last=False,
        )


def check_ours(fd: int, path: str | os.PathLike, others: int = 0o077) -> os.stat_result:
    """fd's file must be a regular file of this user's with one name, and no `others` mode bits."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{path} is not a regular file: refusing it (remove it)")
    if st.st_uid != os.geteuid():
        raise UnsafePath(
            f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): refusing a file someone "
            "else made (remove it; vmgpu makes its own)"
        )
    if st.st_nlink != 1:
        raise UnsafePath(f"{path} has {st.st_nlink} names (hard links): refusing it (remove it)")
    if st.st_mode & others:
        raise UnsafePath(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}, open to other users: refusing it")
    return st


def open_ours(path: str | os.PathLike, flags: int, mode: int = 0o600, others: int = 0o077) -> int:
    """os.open(path) never through a link and only if the file is ours (check_ours); a file it
    creates gets mode."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symbolic link: refusing to follow it (remove it)") from None
        raise
    try:
        check_ours(fd, path, others)
    except UnsafePath:
        os.close(fd)
        raise
    return fd


def remove_ours(path: str | os.PathLike, others: int = 0o007) -> bool:
    """Remove the file at path if it is vmgpu's own: a regular file of this user's with one name,
    not a link, with no `others` mode bits (a region given to a guest's user by ACL shows its
    mask in the group bits).  Whatever else is there is left alone (UnsafePath says why);
    False: nothing was there."""
    try:
        fd = open_ours(path, os.O_RDONLY, others=others)
    except FileNotFoundError:
        return False
    try:
        st = os.fstat(fd)
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):  # replaced since it was checked
            raise UnsafePath(f"{path} changed while it was being removed: left alone")
        os.unlink(path)
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike):
    """Hold an exclusive flock on path (made 0600 if missing, never through a link, only if
    ours) for the with block; whoever else takes it waits."""
    import fcntl

    fd = open_ours(path, os.O_RDWR | os.O_CREAT)
    try:
        os.set_blocking(fd, True)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def create_beside(path: str | os.PathLike, mode: int = 0o600) -> tuple[int, Path]:
    """A new empty file of ours beside path, under a fresh name (O_CREAT|O_EXCL|O_NOFOLLOW: nothing
    planted there is ever opened); (fd, its path).  publish() puts it at path."""
    path = Path(path)
    for _ in range(16):
        tmp = path.with_name(f".vmgpu-new-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue
        os.fchmod(fd, mode)  # whatever the umask
        return fd, tmp
    raise UnsafePath(f"cannot create a file in {path.parent}: every fresh name was taken")


def publish(tmp: Path, path: str | os.PathLike, replace: bool) -> None:
    """Give the file at tmp (from create_beside) the name path, in one step.  replace: whatever
    is at path (a stale file, a planted link) is replaced, never written through; otherwise an
    existing path is left alone and FileExistsError raised."""
    try:
        if replace:
            os.rename(tmp, path)
        else:
            os.link(tmp, path, follow_symlinks=False)
    finally:
        if not replace or os.path.lexists(tmp):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


# POSIX access ACLs (linux/posix_acl_xattr.h): how a guest's user is given its region while
# the file stays root's, so that the guest can neither chmod it open nor be refused at restart.
_ACL_VERSION = 2
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK, _ACL_OTHER = 1, 2, 4, 8, 0x10, 0x20
_ACL_UNDEFINED = 0xFFFFFFFF


def grant(fd: int, uid: int | None, gid: int | None, path: str | os.PathLike = "") -> None:
    """Give user uid and group gid read and write access to fd's file (a POSIX ACL; the owner
    keeps read and write, everyone else has none).  A uid or gid of this process's user/group, of
    root, or None is given nothing: they have it already or need none."""
    me_uid, me_gid = os.geteuid(), os.getegid()
    users = [uid] if uid is not None and uid not in (0, me_uid) else []
    groups = [gid] if gid is not None and gid not in (0, me_gid) else []
    if not users and not groups:
        os.fchmod(fd, 0o600)
        return
    entries = [(_ACL_USER_OBJ, 6, _ACL_UNDEFINED)]
    entries += [(_ACL_USER, 6, u) for u in users]
    entries.append((_ACL_GROUP_OBJ, 0, _ACL_UNDEFINED))
    entries += [(_ACL_GROUP, 6, g) for g in groups]
    entries += [(_ACL_MASK, 6, _ACL_UNDEFINED), (_ACL_OTHER, 0, _ACL_UNDEFINED)]
    blob = struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(fd, "system.posix_acl_access", blob)
    except OSError as e:
        who = ", ".join([f"uid {u}" for u in users] + [f"gid {g}" for g in groups])
        raise UnsafePath(
            f"cannot give {who} access to {path or 'the region'}: {e.strerror} (its file system needs POSIX "
            "ACLs: tmpfs has them when the kernel has CONFIG_TMPFS_POSIX_ACL)"
        ) from None


def granted(fd: int) -> dict[str, list[int]]:
    """The named users and groups fd's ACL gives access to (for tests and `vmgpu doctor`)."""
    try:
        blob = os.getxattr(fd, "system.posix_acl_access")
    except OSError:
        return {"users": [], "groups": []}
    out = {"users": [], "groups": []}
    for off in range(4, len(blob), 8):
        tag, _perm, ident = struct.unpack_from("<HHI", blob, off)
        if tag == _ACL_USER:
            out["users"].append(ident)
        elif tag == _ACL_GROUP:
            out["groups"].append(ident)
    return out
