"""tooz's coordination API over etcd3+http:// (its etcd3gw driver, etcd's
JSON gateway) against one endpoint: locks, groups, capabilities,
heartbeats and membership that ends with its lease.

Usage: tooz_check.py HOST PORT API_VERSION

It prints a transcript with nothing in it that differs from one server
to another, so that two servers' transcripts compare equal when they
behave alike; it exits non-zero at the first check that fails. Run by
e2e/etcdcompat/gateway_clients_test.go against etcd and Tenure.
"""

import sys
import time

import etcd3gw
import tenacity

# Debian's tooz 3.1 passes api_path to etcd3gw.client(), which etcd3gw
# 2.0's does not take (a TypeError against any server); its Etcd3Client
# takes it. docs/etcd.md names this workaround.
etcd3gw.client = etcd3gw.Etcd3Client

from tooz import coordination  # noqa: E402


def say(*args):
    print(*args, flush=True)


def check(cond, what):
    if not cond:
        say("FAIL:", what)
        sys.exit(1)


def raises(f, exc):
    """The name of what f raises: exc's, or another's marked unexpected."""
    try:
        f()
    except exc:
        return exc.__name__
    except Exception as e:  # noqa: BLE001
        return "unexpected " + type(e).__name__
    return "no error"


def poll(cond, seconds, what):
    deadline = time.monotonic() + seconds
    while not cond():
        check(time.monotonic() < deadline, what + " within %ds" % seconds)
        time.sleep(0.1)


def main():
    host, port, api = sys.argv[1], sys.argv[2], sys.argv[3]
    url = "etcd3+http://%s:%s?api_version=%s&timeout=10" % (host, port, api)

    def coordinator(member, **opts):
        u = url + "".join("&%s=%s" % kv for kv in opts.items())
        c = coordination.get_coordinator(u, member)
        c.start(start_heart=False)
        return c

    c1 = coordinator(b"member-1")
    c2 = coordinator(b"member-2")

    # Locks.
    l1 = c1.get_lock(b"lock-a")
    l2 = c2.get_lock(b"lock-a")
    say("acquire 1:", l1.acquire(blocking=False))
    say("acquire 2 while 1 holds:", l2.acquire(blocking=False))
    say("acquired 1:", l1.acquired, "acquired 2:", l2.acquired)
    say("release 2 (not held):", l2.release())
    say("release 1:", l1.release())
    say("acquire 2 (blocking, 5 s):", l2.acquire(blocking=5))
    # (blocking=1 would be blocking=True to tooz: 1 == True in Python.)
    start = time.monotonic()
    # tooz 3.1 lets tenacity's RetryError out when the wait ends (against
    # etcd as well).
    outcome = raises(lambda: l1.acquire(blocking=2), tenacity.RetryError)
    say("acquire 1 (blocking, 2 s) while 2 holds:", outcome, time.monotonic() - start < 8)
    say("lock heartbeat:", c2.heartbeat() > 0)
    say("release 2:", l2.release())
    with c1.get_lock(b"lock-b"):
        say("with lock: held by another:", c2.get_lock(b"lock-b").acquire(blocking=False))
    say("after with: free:", c2.get_lock(b"lock-b").acquire(blocking=False))

    # Groups.
    say("create group:", c1.create_group(b"g").get())
    say("create again:", raises(lambda: c1.create_group(b"g").get(), coordination.GroupAlreadyExist))
    say("groups:", sorted(c1.get_groups().get()))
    say("join 1:", c1.join_group(b"g", capabilities=b"cap-1").get())
    say("join 1 again:", raises(lambda: c1.join_group(b"g").get(), coordination.MemberAlreadyExist))
    say("join 2:", c2.join_group(b"g", capabilities={"role": "b"}).get())
    say("members:", sorted(c1.get_members(b"g").get()))
    say("capabilities 1:", c2.get_member_capabilities(b"g", b"member-1").get())
    say("capabilities 2:", c1.get_member_capabilities(b"g", b"member-2").get())
    c2.update_capabilities(b"g", {"role": "c"}).get()
    say("updated capabilities 2:", c1.get_member_capabilities(b"g", b"member-2").get())
    say("join a group that is not:", raises(lambda: c1.join_group(b"nope").get(), coordination.GroupNotCreated))
    say("delete a group with members:", raises(lambda: c1.delete_group(b"g").get(), coordination.GroupNotEmpty))
    say("leave 2:", c2.leave_group(b"g").get())
    say("leave 2 again:", raises(lambda: c2.leave_group(b"g").get(), coordination.MemberNotJoined))
    say("members after leave:", sorted(c1.get_members(b"g").get()))

    # Heartbeats: a member whose coordinator heartbeats stays past its
    # membership lease's TTL; one that stops is gone when it ends.
    hb = coordinator(b"member-hb", membership_timeout=3)
    quiet = coordinator(b"member-quiet", membership_timeout=3)
    hb.join_group(b"g").get()
    quiet.join_group(b"g").get()
    say("members with both:", sorted(c1.get_members(b"g").get()))
    start = time.monotonic()
    while time.monotonic() - start < 6:  # two TTLs
        check(hb.heartbeat() > 0, "heartbeat")
        time.sleep(0.5)
    poll(lambda: b"member-quiet" not in c1.get_members(b"g").get(), 15, "the quiet member's lease ends")
    say("members after the quiet one's lease ended:", sorted(c1.get_members(b"g").get()))

    c1.leave_group(b"g").get()
    hb.leave_group(b"g").get()
    say("delete group:", c1.delete_group(b"g").get())
    say("members of a deleted group:", raises(lambda: c1.get_members(b"g").get(), coordination.GroupNotCreated))
    say("groups after:", sorted(c1.get_groups().get()))

    for c in (c1, c2, hb, quiet):
        c.stop()
    say("ok")


if __name__ == "__main__":
    main()
