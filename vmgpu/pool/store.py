"""The pool's etcd: the one module that talks to it (through etcd3gw, etcd's v3 JSON gateway
client).  A pool is named by its members, `etcd://host:port[,host:port...]` (or `etcds://...`:
TLS, see tls_settings); a request goes to the
member that answered last and, where it cannot be reached or has no quorum, to the next, so one
member down does not stop the pool while a quorum of them is up.

Keys (values are JSON, vmgpu/pool/records.py):

    /vmgpu/pool/hosts/HOST           a host: its data-plane address, port, lease      (host's lease)
    /vmgpu/pool/gpus/UUID            a GPU: its host, memory, what is free             (host's lease)
    /vmgpu/pool/slices/GUEST/UUID    a guest's slice of a GPU                          (host's lease)
    /vmgpu/pool/guests/GUEST         a guest: its slices, its token's SHA-256          (no lease)

A host's keys and the slices on its GPUs share its lease: when the host stops renewing it, etcd
deletes them together."""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass

import etcd3gw
import requests
from etcd3gw import exceptions as etcd_errors

from vmgpu import files
from vmgpu.errors import InvalidArgument, LedgerError, UnsafePath

PREFIX = "/vmgpu/pool/"
HOSTS = PREFIX + "hosts/"
GPUS = PREFIX + "gpus/"
SLICES = PREFIX + "slices/"
GUESTS = PREFIX + "guests/"
SCHEME = "etcd://"
TLS_SCHEME = "etcds://"
_ENDPOINT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>[0-9]{1,5})$", re.ASCII)
# failures after which the next member is asked: it is unreachable, too slow, or has no quorum
_NEXT_MEMBER = (
    etcd_errors.ConnectionFailedError,
    etcd_errors.ConnectionTimeoutError,
    etcd_errors.InternalServerError,
)


def _tls_reason(e: Exception) -> str:
    """What TLS said, where it refused (a certificate not trusted, none given)."""
    text = str(getattr(e, "detail_text", "") or e)
    for said in ("CERTIFICATE_VERIFY_FAILED", "certificate required", "bad certificate", "wrong version number"):
        if said.lower() in text.lower():
            return f" (TLS: {said})"
    return ""


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def parse_url(url: str) -> list[tuple[str, int]]:
    """The members of `etcd[s]://host:port[,host:port...]`; InvalidArgument naming what is wrong."""
    scheme = next((x for x in (SCHEME, TLS_SCHEME) if url.startswith(x)), None)
    if scheme is None:
        raise InvalidArgument(f"pool {url[:80]!r} is not etcd://HOST:PORT[,HOST:PORT...] (etcds:// for TLS)")
    members = []
    for item in url[len(scheme) :].split(","):
        m = _ENDPOINT.match(item.strip())
        if not m or not 0 < int(m["port"]) < 65536:
            raise InvalidArgument(f"pool {url[:80]!r}: {item[:60]!r} is not HOST:PORT")
        members.append((m["v6"] or m["host"], int(m["port"])))
    return members


@dataclass(frozen=True)
class Entry:
    """One key as etcd holds it."""

    key: str
    value: bytes
    mod_revision: int
    lease: int

    def json(self):
        return json.loads(self.value)


def _private_file(path: str, what: str) -> str:
    """path, a regular file of this user's that only it can read (a key): files.open_ours's check."""
    try:
        os.close(files.open_ours(path, os.O_RDONLY))
    except UnsafePath:
        raise InvalidArgument(
            f"{what} {path} must be a regular file of this user's that only it can read (chmod 600)"
        ) from None
    except OSError as e:
        raise InvalidArgument(f"{what} {path}: {e.strerror}") from None
    return path


def tls_settings(env: dict | None = None) -> dict:
    """An etcds:// pool's TLS, from the environment (so a service sets it once, as VMGPU_POOL):
    VMGPU_POOL_CA, the certificate authority that signed the members' certificates (else the
    system's); VMGPU_POOL_CERT and VMGPU_POOL_KEY, this machine's client certificate and key,
    for members that ask for one (etcd --client-cert-auth)."""
    env = os.environ if env is None else env
    ca, cert, key = (env.get(f"VMGPU_POOL_{k}") or None for k in ("CA", "CERT", "KEY"))
    if bool(cert) != bool(key):
        raise InvalidArgument(
            "give both VMGPU_POOL_CERT and VMGPU_POOL_KEY (a client certificate and its key), or neither"
        )
    if ca and not os.path.isfile(ca):
        raise InvalidArgument(f"VMGPU_POOL_CA {ca}: no such file")
    if cert and not os.path.isfile(cert):
        raise InvalidArgument(f"VMGPU_POOL_CERT {cert}: no such file")
    return {"ca_cert": ca, "cert_cert": cert, "cert_key": _private_file(key, "VMGPU_POOL_KEY") if key else None}


def _tls_session(tls: dict) -> requests.Session:
    """A session that trusts the pool's CA and presents this machine's certificate.  With a CA
    given, the environment's (REQUESTS_CA_BUNDLE, proxies) is not consulted: requests lets it
    override a session's own CA, which would trust the system's authorities instead."""
    session = requests.Session()
    if tls["ca_cert"]:
        session.trust_env = False
        session.verify = tls["ca_cert"]
    if tls["cert_cert"]:
        session.cert = (tls["cert_cert"], tls["cert_key"])
    return session


class Store:
    """The pool's etcd members, one request at a time (one client per thread)."""

    def __init__(self, url: str, timeout_s: float = 2.0):
        self.url = url
        self.members = parse_url(url)
        tls = {"protocol": "https", "session": _tls_session(tls_settings())} if url.startswith(TLS_SCHEME) else {}
        # etcd >= 3.4 (Debian 12 ships 3.4.23) serves the gateway at /v3/: no discovery round trip
        self._clients = [etcd3gw.Etcd3Client(h, p, timeout=timeout_s, api_path="/v3/", **tls) for h, p in self.members]
        self._current = 0

    def _post(self, path: str, body: dict) -> dict:
        """body to path on the member that answered last, else on the next ones in turn."""
        failures = []
        for i in range(len(self._clients)):
            k = (self._current + i) % len(self._clients)
            client = self._clients[k]
            try:
                answer = client.post(client.get_url(path), json=body)
            except _NEXT_MEMBER as e:
                failures.append(f"{client.host}:{client.port}: {type(e).__name__}{_tls_reason(e)}")
                continue
            except etcd_errors.Etcd3Exception as e:
                raise LedgerError(f"pool {self.url}: {path} refused: {str(e.detail_text)[:200]}") from None
            self._current = k
            return answer
        raise LedgerError(
            f"pool {self.url}: no etcd member answers ({'; '.join(failures)}): start them, or check the network "
            "(`vmgpu doctor --pool ...`)"
        )

    # ---- reads ----------------------------------------------------------------------------
    def range(self, prefix: str) -> tuple[list[Entry], int]:
        """Every key under prefix, and the store's revision they were read at."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        answer = self._post("kv/range", {"key": _b64(prefix), "range_end": _b64(end)})
        return [self._entry(kv) for kv in answer.get("kvs", [])], int(answer["header"]["revision"])

    def get(self, key: str) -> Entry | None:
        kvs = self._post("kv/range", {"key": _b64(key)}).get("kvs", [])
        return self._entry(kvs[0]) if kvs else None

    @staticmethod
    def _entry(kv: dict) -> Entry:
        return Entry(
            _unb64(kv["key"]).decode(errors="replace"),
            _unb64(kv.get("value", "")),
            int(kv.get("mod_revision", 0)),
            int(kv.get("lease", 0)),
        )

    # ---- one transaction ------------------------------------------------------------------
    @staticmethod
    def unchanged(entry: Entry) -> dict:
        """A compare: the key is as it was read (its last change is still entry's)."""
        return {"key": _b64(entry.key), "target": "MOD", "result": "EQUAL", "mod_revision": str(entry.mod_revision)}

    @staticmethod
    def absent(key: str) -> dict:
        """A compare: the key does not exist."""
        return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}

    @staticmethod
    def put(key: str, value, lease: int = 0) -> dict:
        body = {"key": _b64(key), "value": _b64(json.dumps(value, sort_keys=True))}
        if lease:
            body["lease"] = str(lease)
        return {"request_put": body}

    @staticmethod
    def delete(key: str) -> dict:
        return {"request_delete_range": {"key": _b64(key)}}

    def txn(self, compare: list[dict], success: list[dict]) -> bool:
        """success applied if every compare holds, all of it or none; whether it was."""
        return bool(self._post("kv/txn", {"compare": compare, "success": success}).get("succeeded", False))

    # ---- leases ---------------------------------------------------------------------------
    def grant(self, ttl_s: int) -> int:
        return int(self._post("lease/grant", {"TTL": str(ttl_s)})["ID"])

    def keep_alive(self, lease: int) -> int:
        """Renew lease: its TTL, or -1 if it has expired (its keys are gone)."""
        return int(self._post("lease/keepalive", {"ID": str(lease)}).get("result", {}).get("TTL", -1))

    def time_to_live(self, lease: int) -> int:
        """Seconds lease has left, -1 if it has expired."""
        return int(self._post("kv/lease/timetolive", {"ID": str(lease)}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        self._post("kv/lease/revoke", {"ID": str(lease)})

    def health(self) -> list[tuple[str, str]]:
        """Each member and what it says: its version and leader, or why it does not answer."""
        out = []
        for c in self._clients:
            try:
                st = c.status()
                out.append((f"{c.host}:{c.port}", f"etcd {st.get('version', '?')}, leader {st.get('leader', '?')}"))
            except etcd_errors.Etcd3Exception as e:
                out.append((f"{c.host}:{c.port}", f"down: {type(e).__name__}{_tls_reason(e)}"))
        return out
