"""`vmgpu-container-runtime`: an OCI runtime in front of runc, for
`docker run --runtime=vmgpu -e VMGPU="gpu=0,mem=4G" IMAGE CMD`.

A container whose process environment asks for no GPU is runc's alone: it has no VMGPU, and
none of the other products' variables that vmgpu/dialects.py translates (China Telecom eGPU's
EGPU, Alibaba cGPU's and eGPU's, boyue's, NVIDIA_VISIBLE_DEVICES).  For one that asks, at
`create` the runtime admits the share through vmgpud (kind container, guest `ctr-<id12>`),
starts the guest's forwarder on a fresh region `/dev/shm/vmgpu-containers/vmgpu-ctr-<id12>` (a
directory only root can enter), and rewrites the bundle's config.json to bind-mount the region
at /dev/vmgpu/region and the guest libcuda.so.1 over the image's (with the guest
libnvidia-ml.so.1 beside it and vmgpu-smi at /usr/bin/vmgpu-smi), and to drop any /dev/nvidia*
device: the container never touches the GPU.  A bind mount of the host's /dev/shm
(`-v /dev/shm:...`, `--ipc=host`), where every guest's region lives, becomes a private tmpfs,
and a recursive bind of a directory above it (`-v /dev:/dev`, `-v /:/host`) is refused: a
container sees its own region only.  The region
stays root's, mode 0600, and the container's user and group (process.user, through the
container's user namespace if it has one) are given read and write access by ACL entries: a
non-root container can use the GPU, nobody else can.  A refusal fails the create, so the
container does not start and docker shows the reason.  At `delete` (the container exited, was
killed, or never started) it releases the share, stops the forwarder and removes the region.
Shares of containers (kind container) that runc no longer knows (a delete that never came) are
released at the next create.

Everything else goes to runc unchanged.  Settings come from the installed script (written
by `vmgpu runtime install`), because docker gives a runtime no environment of its own.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

from vmgpu import dialects, files, names, sched
from vmgpu.config import CONTAINER_REGION_SIZE, RUNTIME_LOG, SHM_DIR, SOCKET, parse_size
from vmgpu.errors import InvalidArgument, VmgpuError
from vmgpu.files import write_atomic
from vmgpu.guest_lifecycle import Guest, Lifecycle
from vmgpu.logging import configure_file, get_logger

KIND = "container"
DEFAULTS = {
    "socket": SOCKET,
    "backend": "cuda",
    "runc": "runc",
    "log": RUNTIME_LOG,
    "shm_dir": SHM_DIR,
    "region_size": CONTAINER_REGION_SIZE,
    "libdir": "",  # where the guest libcuda.so.1 is (default: the build's)
    "docker_root": "/var/lib/docker",  # dockerd's --data-root: where a container's name is learnt
}
REGION_IN_CONTAINER = "/dev/vmgpu/region"
# containers' regions: in a directory of root's, mode 0700, under shm_dir.  A region's ACL gives
# the container's host uid and gid (a gid such as 100, "users", has every local user in it)
# access; only the bind mount, made by root, reaches it, never a local user by its path.
REGION_DIR = "vmgpu-containers"
LIB_IN_CONTAINER = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
# beside it, from the same directory: the guest NVML (nvidia-smi, pynvml) and vmgpu-smi
NVML_IN_CONTAINER = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
SMI_IN_CONTAINER = "/usr/bin/vmgpu-smi"
RUNC_ROOT = "/run/runc"  # runc's state directory unless --root names another
GLOBAL_WITH_VALUE = {"--root", "--log", "--log-format", "--criu", "--rootless"}


def parse(argv: list[str]) -> tuple[dict, str | None, list[str]]:
    """(global options, subcommand, its arguments) of a runc command line."""
    opts, i = {}, 0
    while i < len(argv) and argv[i].startswith("-"):
        a = argv[i]
        if "=" in a:
            k, v = a.split("=", 1)
            opts[k] = v
        elif a in GLOBAL_WITH_VALUE and i + 1 < len(argv):
            opts[a] = argv[i + 1]
            i += 1
        else:
            opts[a] = True
        i += 1
    if i >= len(argv):
        return opts, None, []
    return opts, argv[i], argv[i + 1 :]


def _bundle(args: list[str]) -> Path:
    for i, a in enumerate(args):
        if a in ("--bundle", "-b") and i + 1 < len(args):
            return Path(args[i + 1])
        if a.startswith("--bundle="):
            return Path(a.split("=", 1)[1])
    return Path.cwd()


def guest_name(container_id: str) -> str:
    return names.check_guest(f"ctr-{container_id[:12]}", "container guest name")


def share_of(config: dict, host_gpus=None, log=None) -> str | None:
    """The share spec the container's environment asks for, or None (no GPU): VMGPU as given,
    or another product's variables translated (vmgpu/dialects.py; a contradictory mix refused).
    log: where the translation (one line: dialect, variables, spec) and what is not enforced go.
    host_gpus: the host's GPU indices, asked for only to spell out NVIDIA_VISIBLE_DEVICES=all."""
    env = dialects.environment(config)
    t = dialects.translate(env, host_gpus)
    if log is not None:
        for note in t.notes:
            log.warning("not enforced", dialect=t.dialect, note=note)
        if t.spec is not None and t.dialect != "vmgpu":
            log.info("translated", dialect=t.dialect, variables=t.shown(), share=t.text)
    if t.spec is None:
        return None
    return env[dialects.NATIVE] if dialects.NATIVE in env else t.text


PRIVATE_SHM = {"type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def private_mounts(mounts: list[dict], guarded: list[str], bundle: Path | None = None) -> list[dict]:
    """mounts with every bind of a host directory in guarded (or below) turned into a private
    tmpfs at the same place; a recursive bind of a directory above one refused (InvalidArgument)."""
    tops = [os.path.realpath(g) for g in guarded]
    out = []
    for m in mounts:
        opts = m.get("options") or []
        if m.get("type") != "bind" and not {"bind", "rbind"} & set(opts):
            out.append(m)
            continue
        src = os.path.realpath(os.path.join(bundle or "/", m.get("source") or "/"))
        if any(_within(src, top) for top in tops):
            out.append({"destination": m.get("destination"), **PRIVATE_SHM})
            continue
        if "rbind" in opts and any(_within(top, src) for top in tops):
            raise InvalidArgument(
                f"the container mounts the host's {m.get('source')} with everything below it, which holds the "
                f"other guests' GPU regions ({', '.join(guarded)}); a container with a GPU share may not: mount "
                "only what it needs"
            )
        out.append(m)
    return out


ID_MAX = (1 << 32) - 2  # (uid_t)-1 means "no change" to the kernel: never an owner


def _id(value, what: str) -> int:
    """An id of the OCI spec: an integer 0..ID_MAX (JSON numbers only), else one clear error."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= ID_MAX:
        raise InvalidArgument(f"the container's {what} {str(value)[:40]!r} is not an id (0..{ID_MAX})")
    return value


def _host_id(cid: int, mappings: list[dict] | None, what: str) -> int:
    """A container uid/gid as the host sees it (the container's user namespace, if any)."""
    for mp in mappings or []:
        c, h = _id(mp.get("containerID", 0), f"{what} mapping"), _id(mp.get("hostID", 0), f"{what} mapping")
        n = _id(mp.get("size", 0), f"{what} mapping size")
        if c <= cid < c + n:
            return _id(h + cid - c, what)
    if mappings:
        raise InvalidArgument(f"the container's {what} {cid} is outside its user namespace's mappings")
    return cid


def region_owner(config: dict) -> tuple[int, int]:
    """(uid, gid) on the host that the container's process runs as: they get the region."""
    user = config.get("process", {}).get("user", {}) or {}
    linux = config.get("linux", {}) or {}
    uid, gid = _id(user.get("uid", 0), "uid"), _id(user.get("gid", 0), "gid")
    return _host_id(uid, linux.get("uidMappings"), "uid"), _host_id(gid, linux.get("gidMappings"), "gid")


def give_region(region: Path, uid: int, gid: int) -> None:
    """Give the container's user and group read and write access to its region (root's, 0600;
    ACL entries: files.grant).  Only a region vmgpu made (ours, one link, not a link) is touched."""
    fd = files.open_ours(region, os.O_RDONLY)
    try:
        files.grant(fd, uid, gid, region)
    finally:
        os.close(fd)


def rewrite(
    config: dict, region: Path, lib: Path, guarded: list[str] | None = None, bundle: Path | None = None
) -> dict:
    """The container's config with the region and the guest libraries (libcuda.so.1, and beside it
    libnvidia-ml.so.1 and vmgpu-smi) mounted, no NVIDIA device, and
    no view of the host's shared memory (guarded: the host directories of regions and scheduler
    pages; default /dev/shm and the scheduler's)."""
    ours = {REGION_IN_CONTAINER: (region, "rw"), LIB_IN_CONTAINER: (lib, "ro")}
    for dest, name in ((NVML_IN_CONTAINER, "libnvidia-ml.so.1"), (SMI_IN_CONTAINER, "vmgpu-smi")):
        if (lib.parent / name).exists():
            ours[dest] = (lib.parent / name, "ro")
    guarded = guarded if guarded is not None else [SHM_DIR, str(sched.sched_dir())]
    mounts = [m for m in config.get("mounts", []) if m.get("destination") not in ours]
    mounts = private_mounts(mounts, guarded, bundle)
    for dest, (src, mode) in ours.items():
        mounts.append({"destination": dest, "type": "bind", "source": str(src), "options": ["rbind", mode]})
    config["mounts"] = mounts
    linux = config.setdefault("linux", {})
    linux["devices"] = [d for d in linux.get("devices", []) if not d.get("path", "").startswith("/dev/nvidia")]
    env = [kv for kv in config.setdefault("process", {}).get("env", []) if not kv.startswith("VMGPU_REGION=")]
    config["process"]["env"] = env + [f"VMGPU_REGION={REGION_IN_CONTAINER}"]
    return config


def report_error(opts: dict, msg: str) -> None:
    """Where runc would: docker shows the last error line of the runtime's --log file."""
    path = opts.get("--log")
    if not path or path is True:
        return
    line = {"level": "error", "msg": msg, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass


# The name an operator knows a container by, in the OCI config's annotations: vmgpu's own (docker
# 24+: `docker run --annotation vmgpu.label=NAME`), else the CRI's (containerd under Kubernetes:
# pod/container).  Docker itself passes no name to its runtime: it is read from dockerd's record
# of the container (DOCKER_RECORD under docker_root), which dockerd writes before it starts it.
LABEL_ANNOTATION = "vmgpu.label"
CRI_NAME, CRI_POD = "io.kubernetes.cri.container-name", "io.kubernetes.cri.sandbox-name"
DOCKER_RECORD = "containers/{id}/config.v2.json"
DOCKER_RECORD_MAX = 4 << 20
_DOCKER_ID = re.compile(r"^[0-9a-f]{64}$", re.ASCII)


class Runtime:
    def __init__(self, settings: dict):
        self.s = {**DEFAULTS, **settings}
        self.log = get_logger(component="runtime")

    def _client(self):
        from vmgpu.client import Client

        return Client(self.s["socket"], timeout=10.0, retry_s=5.0)

    def _region(self, guest: str) -> Path:
        return Path(self.s["shm_dir"]) / REGION_DIR / f"vmgpu-{guest}"

    def _lib(self) -> Path:
        if self.s["libdir"]:
            return Path(self.s["libdir"]) / "libcuda.so.1"
        from vmgpu.forwarder import native_dir

        return native_dir() / "guest" / "libcuda.so.1"

    def _host_gpus(self) -> list[str]:
        """The host's GPU indices, as vmgpud knows them."""
        client = self._client()
        try:
            return [str(g.index) for g in client.status().gpus]
        finally:
            client.close()

    def runc(self, argv: list[str]) -> int:
        return subprocess.run([self.s["runc"], *argv]).returncode

    def label(self, config: dict, cid: str) -> str:
        """What the operator knows the container by (its docker name), or "" where it cannot be
        learnt: untrusted text, which vmgpud cleans and bounds (config.label_text)."""
        notes = config.get("annotations") if isinstance(config, dict) else None
        notes = notes if isinstance(notes, dict) else {}
        own, name, pod = (notes.get(k) for k in (LABEL_ANNOTATION, CRI_NAME, CRI_POD))
        if isinstance(own, str) and own.strip():
            return own
        if isinstance(name, str) and name.strip():
            return f"{pod}/{name}" if isinstance(pod, str) and pod.strip() else name
        return self._docker_name(cid)

    def _docker_name(self, cid: str) -> str:
        """The container's name in dockerd's record of it (root's, read never through a link)."""
        if not _DOCKER_ID.match(cid) or not self.s.get("docker_root"):
            return ""
        path = Path(self.s["docker_root"]) / DOCKER_RECORD.format(id=cid)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return ""  # not docker's container, or another data root
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_size > DOCKER_RECORD_MAX:
                self.log.warning("docker's record of the container ignored", path=str(path))
                return ""
            with os.fdopen(os.dup(fd), "rb") as f:
                record = json.loads(f.read(DOCKER_RECORD_MAX))
        except (OSError, ValueError) as e:
            self.log.warning("docker's record of the container unreadable", path=str(path), error=str(e))
            return ""
        finally:
            os.close(fd)
        name = record.get("Name") if isinstance(record, dict) else None
        return name.removeprefix("/") if isinstance(name, str) else ""

    def collect_stale(self, client, root: Path) -> None:
        """Release container guests whose container runc no longer knows."""
        try:
            known = {p.name[:12] for p in root.iterdir()}
        except OSError:
            return
        for sl in client.status().slices:
            if sl.kind == KIND and sl.guest.startswith("ctr-") and sl.guest[4:] not in known:
                Lifecycle(client, Guest(sl.guest, KIND, self._region(sl.guest))).release()
                self.log.info("released a stale container share", guest=sl.guest)

    def create(self, argv: list[str], opts: dict, args: list[str]) -> int:
        bundle, cid = _bundle(args), args[-1]
        cfg_path = bundle / "config.json"
        config = json.loads(cfg_path.read_text())
        spec = share_of(config, self._host_gpus, self.log)
        if spec is None:
            return self.runc(argv)
        guest = guest_name(cid)
        region = self._region(guest)
        files.private_dir(region.parent)
        guarded = sorted({SHM_DIR, self.s["shm_dir"], str(sched.sched_dir())})
        uid, gid = region_owner(config)
        new_config = rewrite(config, region, self._lib(), guarded, bundle)  # refuses before admitting
        # Creates run one at a time, from the look for stale shares until runc has made the
        # container's state: another create's look would take a container admitted but not yet
        # known to runc for a stale one, and release it under it.
        with files.exclusive_lock(region.parent / ".create.lock"):
            label = self.label(config, cid)
            with self._lifecycle(guest, label) as lc:
                self.collect_stale(lc.client, Path(opts.get("--root", RUNC_ROOT)))
                lc.prepare(
                    spec,
                    parse_size(self.s["region_size"]),
                    (uid, gid),  # the container's user and group get the region (ACL entries)
                    then=lambda: write_atomic(cfg_path, json.dumps(new_config)),
                )
                self.log.info("admitted", guest=guest, label=label, share=spec, region=str(region))
            rc = self.runc(argv)
        if rc != 0:
            self._release(guest)
        return rc

    def _lifecycle(self, guest: str, label: str = "") -> Lifecycle:
        g = Guest(guest, KIND, self._region(guest), self.s["backend"], label=label)
        return Lifecycle(self._client(), g, self.log)

    def _release(self, guest: str) -> None:
        with self._lifecycle(guest) as lc:
            lc.release()
        self.log.info("released", guest=guest)

    def delete(self, argv: list[str], opts: dict, args: list[str]) -> int:
        rc = self.runc(argv)
        cid = args[-1] if args else ""
        root = Path(opts.get("--root", RUNC_ROOT))
        if cid and (rc == 0 or not (root / cid).exists()):
            guest = guest_name(cid)
            try:
                self._release(guest)
            except VmgpuError as e:
                self.log.error("release failed", guest=guest, error=e.message)
        return rc

    def main(self, argv: list[str]) -> int:
        opts, cmd, args = parse(argv)
        try:
            if cmd == "create":
                return self.create(argv, opts, args)
            if cmd == "delete":
                return self.delete(argv, opts, args)
        except VmgpuError as e:
            self.log.error("failed", command=cmd, error=e.message, code=e.code)
            msg = f"vmgpu: {e.message} [{e.code}]"
            print(msg, file=sys.stderr)
            report_error(opts, msg)
            return 1
        return self.runc(argv)


def main(argv: list[str], settings: dict) -> int:
    """The installed script's entry point."""
    merged = {**DEFAULTS, **settings}
    configure_file(merged["log"])
    return Runtime(merged).main(argv)


# ---- installing ------------------------------------------------------------------------

SCRIPT = """#!{python}
# vmgpu's OCI runtime for docker (`docker run --runtime=vmgpu -e VMGPU=...`), written by
# `vmgpu setup` or `vmgpu runtime install`; what it does: vmgpu/oci.py.
import sys

SETTINGS = {settings!r}

if __name__ == "__main__":
    from vmgpu.oci import main

    sys.exit(main(sys.argv[1:], SETTINGS))
"""


def script_text(settings: dict, python: str | None = None) -> str:
    """The runtime script as installed: run by python (default: this one), with these settings."""
    return SCRIPT.format(python=python or sys.executable, settings={**DEFAULTS, **settings})


def daemon_json_text(daemon_json: str | Path, runtime_path: str | Path | None) -> str:
    """docker's daemon.json with the runtime 'vmgpu' registered at runtime_path (None: removed),
    everything else kept as it is; a missing or empty file counts as {}."""
    dj = Path(daemon_json)
    try:
        text = dj.read_text() if dj.exists() else ""
        conf = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise VmgpuError(f"{dj} is not valid JSON ({e}); fix it, then run this again") from None
    if not isinstance(conf, dict):
        raise VmgpuError(f"{dj} is not a JSON object; fix it, then run this again")
    runtimes = conf.setdefault("runtimes", {})
    if runtime_path is None:
        runtimes.pop("vmgpu", None)
        if not runtimes:
            del conf["runtimes"]
    else:
        runtimes["vmgpu"] = {"path": str(runtime_path)}
    return json.dumps(conf, indent=2) + "\n"


def install(path: str | Path, settings: dict, daemon_json: str | Path | None, python: str | None = None) -> dict:
    """Write the runtime script at path (run by python, default this one) and register it in
    docker's daemon.json (kept as it is otherwise); docker reads daemon.json at start-up and on
    SIGHUP."""
    new_conf = daemon_json_text(daemon_json, path) if daemon_json else None  # refuses a broken one first
    path = write_atomic(path, script_text(settings, python), 0o755)
    out = {"path": str(path), "daemon_json": None}
    if daemon_json:
        write_atomic(daemon_json, new_conf)
        out["daemon_json"] = str(daemon_json)
    return out
