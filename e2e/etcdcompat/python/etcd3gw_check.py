"""etcd3gw's functional behaviour against one etcd endpoint (etcd's JSON
gateway): keys, prefixes, transactions, watches, leases, locks.

Usage: etcd3gw_check.py HOST PORT API_PATH

It prints a transcript of what it saw, with nothing in it that differs
from one server to another (no revisions, ids or times), so that the
transcripts of two servers compare equal when they behave alike; it
exits non-zero at the first check that fails. Run by
e2e/etcdcompat/gateway_clients_test.go against etcd and Tenure.
"""

import sys
import threading

from etcd3gw.client import Etcd3Client
from etcd3gw import exceptions


def say(*args):
    print(*args, flush=True)


def check(cond, what):
    if not cond:
        say("FAIL:", what)
        sys.exit(1)


def main():
    host, port, api_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    c = Etcd3Client(host=host, port=port, api_path=api_path, timeout=30)

    st = c.status()
    say("status has version, dbSize, leader:", all(k in st for k in ("version", "dbSize", "leader")))
    say("members:", len(c.members()))

    # Keys.
    say("put:", c.put("k1", "v1"))
    say("get:", c.get("k1"))
    say("get missing:", c.get("nothing"))
    value, meta = c.get("k1", metadata=True)[0]
    say("metadata:", value, meta["key"], meta["version"],
        int(meta["create_revision"]) == int(meta["mod_revision"]) > 0)
    say("put again:", c.put("k1", "v1b"))
    _, meta = c.get("k1", metadata=True)[0]
    say("version after a second put:", meta["version"])
    say("create new:", c.create("k2", "v2"))
    say("create existing:", c.create("k2", "other"))
    say("replace right:", c.replace("k2", "v2", "v2b"))
    say("replace wrong:", c.replace("k2", "v2", "v2c"))
    say("get after replace:", c.get("k2"))
    say("delete:", c.delete("k2"))
    say("delete again:", c.delete("k2"))
    say("get deleted:", c.get("k2"))

    # Prefixes.
    for k in ("p/c", "p/a", "p/b"):
        c.put(k, "val-" + k)
    say("get_prefix:", [(v, m["key"]) for v, m in c.get_prefix("p/")])
    say("get_prefix descending by key:",
        [m["key"] for _, m in c.get_prefix("p/", sort_order="descend", sort_target="key")])
    say("delete_prefix:", c.delete_prefix("p/"))
    say("get_prefix after:", c.get_prefix("p/"))

    # A raw transaction.
    txn = c.transaction({
        "compare": [{"key": "azE=", "result": "EQUAL", "target": "VALUE", "value": "djFi"}],
        "success": [{"request_range": {"key": "azE="}}],
        "failure": [],
    })
    say("txn:", txn.get("succeeded"), len(txn.get("responses", [])))

    # Watches: from a revision, so that no event can be missed.
    c.put("w/1", "a")
    rev = int(c.get("w/1", metadata=True)[0][1]["mod_revision"])
    ev = c.watch_once("w/1", timeout=10, start_revision=rev)
    say("watch_once:", ev["kv"]["key"], ev["kv"]["value"], ev.get("type", "PUT"))
    events, cancel = c.watch_prefix("w/", start_revision=rev)
    first = next(events)
    say("watch_prefix first:", first["kv"]["key"], first["kv"]["value"])
    c.put("w/2", "b")
    c.delete("w/1")
    second = next(events)
    say("watch_prefix second:", second["kv"]["key"], second["kv"]["value"])
    third = next(events)
    say("watch_prefix third:", third["kv"]["key"], third.get("type"))
    cancel()

    # Leases.
    lease = c.lease(ttl=20)
    ttl = lease.ttl()
    say("lease ttl in (0, 20]:", 0 < ttl <= 20)
    say("put with lease:", c.put("l/1", "x", lease=lease))
    say("lease keys:", lease.keys())
    say("refresh:", lease.refresh())
    say("revoke:", lease.revoke())
    say("key after revoke:", c.get("l/1"))
    say("ttl after revoke:", lease.ttl())
    say("refresh after revoke:", lease.refresh())

    # Locks.
    a = c.lock("L", ttl=20)
    b = c.lock("L", ttl=20)
    say("acquire a:", a.acquire())
    say("acquire b while a holds:", b.acquire())
    say("a is acquired:", a.is_acquired(), "b is acquired:", b.is_acquired())
    say("refresh a:", a.refresh())
    say("release b (not held):", b.release())
    say("release a:", a.release())
    say("acquire b:", b.acquire())
    say("release b:", b.release())
    with c.lock("ctx", ttl=20) as lk:
        say("context manager holds:", lk.is_acquired())
    say("context manager released:", c.get("/locks/ctx"))

    # Concurrent lock contention: exactly one of the threads wins.
    wins = []
    def contend(i):
        if c.lock("race", ttl=20).acquire():
            wins.append(i)
    threads = [threading.Thread(target=contend, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    say("contenders that won:", len(wins))

    # An error, as the client raises it.
    try:
        c.post(c.get_url("/kv/put"), json={"value": "dg=="})
        say("put without a key: no error")
    except exceptions.Etcd3Exception as e:
        say("put without a key:", type(e).__name__, "key is not provided" in str(e.detail_text))

    say("ok")


if __name__ == "__main__":
    main()
