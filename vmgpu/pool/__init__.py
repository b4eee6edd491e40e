"""The GPU pool across hosts: each host's GPUs registered in etcd under its lease, and guests on
any machine admitted to slices of them in one etcd transaction.  Opt-in (`--pool etcd://...`);
a single host keeps its SQLite ledger (vmgpu/ledger.py).

    store.py      the one etcd3gw user: endpoints (failover between members), keys, leases, txns
    records.py    what each key holds (host, GPU, slice, guest), checked when read
    agent.py      `vmgpu pool join`: a host's registration and its lease kept alive
    admission.py  a guest's request (or boyue's variables), the least-loaded choice, the one
                  all-or-nothing transaction, release, and the data plane's token check
    status.py     what `vmgpu pool status` shows
    net.py        the one pyroute2 user: an interface's address, the route and MTU to a host

The guest's data path over the network (the forwarder at a host's address and port) is not
built yet; a grant names it and carries the token it will check (admission.verify_token)."""
