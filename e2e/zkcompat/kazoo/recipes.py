"""Kazoo's recipes, run unmodified against a ZooKeeper server.

Usage: recipes.py HOSTS ROOT CASE [ARGS...]

Each case uses paths under ROOT only, prints "ok" when every check held,
and exits non-zero (with the failed check) otherwise. The Go tests in this
directory's parent start it against ZooKeeper 3.8 and against Tenure.
"""

import os
import sys
import threading
import time

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import LockTimeout
from kazoo.recipe.cache import TreeCache, TreeEvent
from kazoo.recipe.lease import MultiNonBlockingLease, NonBlockingLease
from kazoo.recipe.partitioner import PartitionState

HOSTS = sys.argv[1]
ROOT = sys.argv[2]
CASE = sys.argv[3]
ARGS = sys.argv[4:]

WAIT = 20.0  # seconds any awaited condition may take


def client(timeout=10.0):
    c = KazooClient(hosts=HOSTS, timeout=timeout)
    c.start(timeout=WAIT)
    return c


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def wait_until(cond, what, deadline=WAIT):
    end = time.monotonic() + deadline
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("not within %.0fs: %s" % (deadline, what))
        time.sleep(0.01)


def append_line(path, line):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def last_line(path):
    with open(path) as f:
        lines = f.read().splitlines()
    return lines[-1] if lines else ""


def lock_worker(log, rounds):
    """Takes ROOT/lock `rounds` times; inside, the log's last line must be
    its own "enter" (no other holder wrote in between)."""
    me = "%d" % os.getpid()
    c = client()
    lock = c.Lock(ROOT + "/lock", me)
    for _ in range(int(rounds)):
        with lock:
            append_line(log, "enter " + me)
            time.sleep(0.01)
            check(last_line(log) == "enter " + me, "another holder wrote inside the lock")
            check(me in lock.contenders(), "holder not among the contenders")
            append_line(log, "exit " + me)
    c.stop()


def rwlock():
    c1, c2, c3 = client(), client(), client()
    path = ROOT + "/rw"
    r1, r2 = c1.ReadLock(path, "r1"), c2.ReadLock(path, "r2")
    w = c3.WriteLock(path, "w")
    check(r1.acquire(timeout=WAIT), "first reader")
    check(r2.acquire(timeout=WAIT), "second reader beside the first")
    try:
        w.acquire(timeout=0.5)
        raise AssertionError("writer acquired beside readers")
    except LockTimeout:
        pass
    r1.release()
    r2.release()
    check(w.acquire(timeout=WAIT), "writer after the readers left")
    try:
        r1.acquire(timeout=0.5)
        raise AssertionError("reader acquired beside the writer")
    except LockTimeout:
        pass
    w.release()
    check(r1.acquire(timeout=WAIT), "reader after the writer left")
    r1.release()
    for c in (c1, c2, c3):
        c.stop()


def semaphore():
    cs = [client() for _ in range(3)]
    sems = [c.Semaphore(ROOT + "/sem", "s%d" % i, max_leases=2) for i, c in enumerate(cs)]
    check(sems[0].acquire(timeout=WAIT), "first lease")
    check(sems[1].acquire(timeout=WAIT), "second lease")
    check(not sems[2].acquire(blocking=False), "a third lease of two")
    check(sorted(sems[0].lease_holders()) == ["s0", "s1"], "holders %r" % sems[0].lease_holders())
    sems[0].release()
    check(sems[2].acquire(timeout=WAIT), "third after a release")
    check(sorted(sems[1].lease_holders()) == ["s1", "s2"], "holders %r" % sems[1].lease_holders())
    sems[1].release()
    sems[2].release()
    for c in cs:
        c.stop()


def election():
    path = ROOT + "/election"
    leading = []
    stop = {"a": threading.Event(), "b": threading.Event()}

    def lead(name):
        def run():
            leading.append(name)
            stop[name].wait(WAIT * 2)
        return run

    ca, cb = client(), client()
    ea, eb = ca.Election(path, "a"), cb.Election(path, "b")
    ta = threading.Thread(target=ea.run, args=(lead("a"),), daemon=True)
    ta.start()
    wait_until(lambda: leading == ["a"], "a leads")
    tb = threading.Thread(target=eb.run, args=(lead("b"),), daemon=True)
    tb.start()
    wait_until(lambda: eb.contenders() == ["a", "b"], "contenders a, b: %r" % eb.contenders())
    check(leading == ["a"], "only a leads: %r" % leading)
    stop["a"].set()
    ta.join(WAIT)
    wait_until(lambda: leading == ["a", "b"], "b leads after a")
    check(eb.contenders() == ["b"], "contenders after a left: %r" % eb.contenders())
    stop["b"].set()
    tb.join(WAIT)
    ca.stop()
    cb.stop()


def queue():
    c1, c2 = client(), client()
    q1, q2 = c1.Queue(ROOT + "/queue"), c2.Queue(ROOT + "/queue")
    q1.put(b"low", priority=200)
    q1.put(b"first", priority=10)
    q1.put(b"second", priority=10)
    q1.put(b"mid", priority=100)
    check(len(q2) == 4, "length %d" % len(q2))
    got = [q2.get() for _ in range(4)]
    check(got == [b"first", b"second", b"mid", b"low"], "order %r" % got)
    check(q2.get() is None, "empty queue")
    # LockingQueue: an entry taken is held until consumed or released.
    l1, l2 = c1.LockingQueue(ROOT + "/lq"), c2.LockingQueue(ROOT + "/lq")
    l1.put_all([b"a", b"b"])
    l1.put(b"urgent", priority=1)
    check(len(l2) == 3, "locking queue length %d" % len(l2))
    check(l1.get(timeout=WAIT) == b"urgent", "priority first")
    check(l2.get(timeout=WAIT) == b"a", "the next entry, not the held one")
    check(l2.release(), "release a")
    check(l1.consume(), "consume urgent")
    check(l1.get(timeout=WAIT) == b"a", "a again after its release")
    check(l1.consume(), "consume a")
    check(l2.get(timeout=WAIT) == b"b", "b")
    check(l2.consume(), "consume b")
    check(len(l1) == 0, "locking queue empty, length %d" % len(l1))
    check(l1.get(timeout=0.3) is None, "get on an empty queue times out")
    c1.stop()
    c2.stop()


def counter():
    cs = [client() for _ in range(3)]
    errors = []

    def add(c):
        try:
            cnt = c.Counter(ROOT + "/counter")
            for _ in range(20):
                cnt += 1
        except Exception as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=add, args=(c,)) for c in cs]
    for t in ts:
        t.start()
    for t in ts:
        t.join(WAIT * 3)
    check(not errors, "errors: %r" % errors)
    cnt = cs[0].Counter(ROOT + "/counter")
    check(cnt.value == 60, "value %r" % cnt.value)
    cnt -= 5
    check(cnt.value == 55, "value after -5: %r" % cnt.value)
    check(cnt.pre_value == 60 and cnt.post_value == 55, "pre/post %r %r" % (cnt.pre_value, cnt.post_value))
    f = cs[1].Counter(ROOT + "/fcounter", default=0.0)
    f += 1.5
    check(f.value == 1.5, "float counter %r" % f.value)
    for c in cs:
        c.stop()


def barrier():
    c1, c2 = client(), client()
    b1, b2 = c1.Barrier(ROOT + "/barrier"), c2.Barrier(ROOT + "/barrier")
    b1.create()
    check(b1.client.exists(ROOT + "/barrier") is not None, "barrier created")
    check(not b2.wait(timeout=0.3), "waiter passed a standing barrier")
    released = []
    t = threading.Thread(target=lambda: released.append(b2.wait(timeout=WAIT)))
    t.start()
    check(b1.remove(), "remove barrier")
    t.join(WAIT)
    check(released == [True], "waiter released: %r" % released)
    check(b2.wait(timeout=0.1), "no barrier: wait passes")
    # DoubleBarrier: nobody proceeds until all three entered, nor leaves
    # until all three left.
    cs = [client() for _ in range(3)]
    state = {"entered": 0, "left": 0, "bad": []}
    lock = threading.Lock()

    def member(c, i):
        db = c.DoubleBarrier(ROOT + "/double", 3, identifier="m%d" % i)
        with lock:
            state["entered"] += 1
        db.enter()
        with lock:
            if state["entered"] != 3:
                state["bad"].append("m%d entered with %d in" % (i, state["entered"]))
            state["left"] += 1
        db.leave()
        with lock:
            if state["left"] != 3:
                state["bad"].append("m%d left with %d out" % (i, state["left"]))

    ts = []
    for i, c in enumerate(cs):
        ts.append(threading.Thread(target=member, args=(c, i), daemon=True))
        ts[-1].start()
        if i < 2:
            time.sleep(0.2)  # not synchronization: lets the first wait alone a while
    for t in ts:
        t.join(WAIT)
        check(not t.is_alive(), "a member still inside the double barrier")
    check(not state["bad"], "%r" % state["bad"])
    for c in cs + [c1, c2]:
        c.stop()


def party():
    c1, c2 = client(), client()
    p1, p2 = c1.Party(ROOT + "/party", "a"), c2.Party(ROOT + "/party", "b")
    p1.join()
    p2.join()
    check(len(p1) == 2, "party of %d" % len(p1))
    check(sorted(p1) == ["a", "b"], "members %r" % sorted(p1))
    p1.leave()
    check(list(p2) == ["b"], "members after a left %r" % list(p2))
    s1, s2 = c1.ShallowParty(ROOT + "/shallow", "x"), c2.ShallowParty(ROOT + "/shallow", "y")
    s1.join()
    s2.join()
    check(sorted(s2) == ["x", "y"], "shallow members %r" % sorted(s2))
    s2.leave()
    check(list(s1) == ["x"], "shallow members after y left %r" % list(s1))
    c1.stop()
    c2.stop()


def partitioner():
    items = list(range(8))
    cs = [client() for _ in range(2)]
    parts = [c.SetPartitioner(ROOT + "/partition", set=items, identifier="p%d" % i, time_boundary=0.5)
             for i, c in enumerate(cs)]

    def step(p):
        if p.failed:
            raise AssertionError("partitioner failed")
        if p.release:
            p.release_set()
        elif p.allocating:
            p.wait_for_acquire(timeout=0.2)

    def settled():
        for p in parts:
            step(p)
        return all(p.acquired for p in parts) and \
            sorted(list(parts[0]) + list(parts[1])) == items
    wait_until(settled, "both partitioners acquired a split of the set")
    a, b = set(parts[0]), set(parts[1])
    check(a and b and not a & b, "split %r %r" % (sorted(a), sorted(b)))
    # One leaves: the other ends up with everything.
    parts[1].finish()
    cs[1].stop()

    def alone():
        step(parts[0])
        return parts[0].acquired and sorted(parts[0]) == items
    wait_until(alone, "the remaining partitioner took the whole set")
    parts[0].finish()
    cs[0].stop()


def hold_ephemeral(path, timeout_s):
    """Creates an ephemeral node, prints its session id, and waits to be
    killed."""
    c = client(timeout=float(timeout_s))
    c.create(path, b"held", ephemeral=True, makepath=True)
    print("session %x" % c.client_id[0], flush=True)
    time.sleep(3600)


def watches():
    c1, c2 = client(), client()
    path = ROOT + "/watched"
    seen = []
    c1.ensure_path(ROOT)

    @c1.DataWatch(path)
    def data(value, stat):
        seen.append(None if stat is None else (value, stat.version))

    wait_until(lambda: seen == [None], "DataWatch's first call: %r" % seen)
    c2.create(path, b"v0")
    wait_until(lambda: seen[-1:] == [(b"v0", 0)], "DataWatch saw the create: %r" % seen)
    c2.set(path, b"v1")
    wait_until(lambda: seen[-1:] == [(b"v1", 1)], "DataWatch saw the set: %r" % seen)
    c2.set(path, b"v2")
    wait_until(lambda: seen[-1:] == [(b"v2", 2)], "DataWatch saw the second set: %r" % seen)
    c2.delete(path)
    wait_until(lambda: seen[-1:] == [None], "DataWatch saw the delete: %r" % seen)
    check(seen == [None, (b"v0", 0), (b"v1", 1), (b"v2", 2), None], "DataWatch calls %r" % seen)

    kids = []
    c2.ensure_path(ROOT + "/kids")

    @c1.ChildrenWatch(ROOT + "/kids")
    def children(names):
        kids.append(sorted(names))

    wait_until(lambda: kids == [[]], "ChildrenWatch's first call: %r" % kids)
    c2.create(ROOT + "/kids/a")
    wait_until(lambda: kids[-1:] == [["a"]], "ChildrenWatch saw a: %r" % kids)
    c2.create(ROOT + "/kids/b", ephemeral=True)
    wait_until(lambda: kids[-1:] == [["a", "b"]], "ChildrenWatch saw b: %r" % kids)
    c2.set(ROOT + "/kids/a", b"data changes are not child changes")
    c2.delete(ROOT + "/kids/a")
    wait_until(lambda: kids[-1:] == [["b"]], "ChildrenWatch saw a go: %r" % kids)
    c2.stop()  # b is ephemeral: it goes with c2's session
    wait_until(lambda: kids[-1:] == [[]], "ChildrenWatch saw the ephemeral go: %r" % kids)
    check(kids == [[], ["a"], ["a", "b"], ["b"], []], "ChildrenWatch calls %r" % kids)

    # Raw one-shot watches through the client API: one event per watch.
    events = []
    c1.create(ROOT + "/raw", b"x")
    c1.get(ROOT + "/raw", watch=events.append)
    c3 = client()
    c3.set(ROOT + "/raw", b"y")
    c3.set(ROOT + "/raw", b"z")
    wait_until(lambda: len(events) == 1, "one-shot data watch fired")
    check(events[0].type == "CHANGED" and events[0].path == ROOT + "/raw", "event %r" % (events[0],))
    c3.stop()
    c1.stop()


def peer(c):
    """The member c is connected to (host:port), or "?"."""
    try:
        return "%s:%d" % c._connection._socket.getpeername()[:2]
    except Exception:
        return "?"


def failover_holder(log):
    """Takes ROOT/lock through the first of HOSTS, then waits for the test
    to kill that member: the session must move to another member (never
    lost), keeping the lock node, until LOG.release appears."""
    c = KazooClient(hosts=HOSTS, timeout=10.0, randomize_hosts=False,
                    connection_retry=dict(max_tries=-1, delay=0.1, max_delay=0.5))
    states = []
    c.add_listener(states.append)
    c.start(timeout=WAIT)
    lock = c.Lock(ROOT + "/lock", "holder")
    check(lock.acquire(timeout=WAIT), "acquire")
    path = ROOT + "/lock/" + lock.node
    st = c.exists(path)
    sid = c.client_id[0]
    append_line(log, "enter holder")
    print("held %x %s %d via %s" % (sid, path, st.czxid, peer(c)), flush=True)
    wait_until(lambda: KazooState.SUSPENDED in states and c.state == KazooState.CONNECTED,
               "the connection moved to another member (states %r)" % states, deadline=90)
    check(KazooState.LOST not in states, "session lost: %r" % states)
    check(c.client_id[0] == sid, "a new session %x" % c.client_id[0])
    st2 = c.exists(path)
    check(st2 is not None, "the lock node is gone")
    check(st2.czxid == st.czxid and st2.ephemeralOwner == sid, "the lock node changed: %r" % (st2,))
    check(lock.is_acquired and lock.contenders()[0] == "holder", "not the holder: %r" % lock.contenders())
    print("reconnected via %s" % peer(c), flush=True)
    wait_until(lambda: os.path.exists(log + ".release"), "release file", deadline=90)
    check(last_line(log) == "enter holder", "another holder wrote inside the lock")
    append_line(log, "exit holder")
    lock.release()
    c.stop()


def failover_contender(log):
    """Waits for ROOT/lock behind the holder, through any member."""
    c = KazooClient(hosts=HOSTS, timeout=10.0, connection_retry=dict(max_tries=-1, delay=0.1, max_delay=0.5))
    c.start(timeout=WAIT)
    lock = c.Lock(ROOT + "/lock", "contender")
    check(lock.acquire(timeout=180), "acquire")
    print("acquired %d" % c.exists(ROOT + "/lock/" + lock.node).czxid, flush=True)
    append_line(log, "enter contender")
    check(last_line(log) == "enter contender", "another holder wrote inside the lock")
    append_line(log, "exit contender")
    lock.release()
    c.stop()


def hold_lock(log):
    """Takes ROOT/lock and holds it until LOG.release appears."""
    c = client()
    lock = c.Lock(ROOT + "/lock", "holder")
    check(lock.acquire(timeout=WAIT), "acquire")
    append_line(log, "enter holder")
    print("held", flush=True)
    wait_until(lambda: os.path.exists(log + ".release"), "release file", deadline=120)
    append_line(log, "exit holder")
    lock.release()
    c.stop()


def failover_waiter(log):
    """Queues for ROOT/lock through the first of HOSTS; the test kills that
    member while it waits: its session and its watch on the node ahead of
    it move to another member, and it gets the lock once that is
    released."""
    c = KazooClient(hosts=HOSTS, timeout=10.0, randomize_hosts=False,
                    connection_retry=dict(max_tries=-1, delay=0.1, max_delay=0.5))
    states = []

    def listen(state):
        states.append(state)
        if state == KazooState.CONNECTED and KazooState.SUSPENDED in states:
            print("reconnected", flush=True)
    c.add_listener(listen)
    c.start(timeout=WAIT)
    sid = c.client_id[0]
    print("waiting via %s" % peer(c), flush=True)
    lock = c.Lock(ROOT + "/lock", "waiter")
    check(lock.acquire(timeout=180), "acquire")
    check(KazooState.LOST not in states, "session lost: %r" % states)
    check(c.client_id[0] == sid, "a new session %x" % c.client_id[0])
    append_line(log, "enter waiter")
    print("acquired via %s" % peer(c), flush=True)
    append_line(log, "exit waiter")
    lock.release()
    c.stop()


def tree_cache():
    """TreeCache mirrors a subtree: additions, updates and removals below
    ROOT reach it, in its data and children and as events."""
    writer, reader = client(), client()
    writer.ensure_path(ROOT + "/a")
    writer.create(ROOT + "/a/x", b"1")
    events = []
    cache = TreeCache(reader, ROOT)
    cache.listen(lambda e: events.append((e.event_type, e.event_data.path if e.event_data else None)))
    cache.start()
    wait_until(lambda: (TreeEvent.INITIALIZED, None) in events, "initialized: %r" % events)
    check(cache.get_data(ROOT + "/a/x").data == b"1", "the initial data")
    writer.create(ROOT + "/a/y", b"2")
    writer.set(ROOT + "/a/x", b"3")
    wait_until(lambda: cache.get_data(ROOT + "/a/x") is not None and cache.get_data(ROOT + "/a/x").data == b"3", "the update")
    wait_until(lambda: sorted(cache.get_children(ROOT + "/a") or []) == ["x", "y"], "the addition: %r" % cache.get_children(ROOT + "/a"))
    writer.delete(ROOT + "/a/y")
    wait_until(lambda: (TreeEvent.NODE_REMOVED, ROOT + "/a/y") in events, "the removal: %r" % events)
    check(sorted(cache.get_children(ROOT + "/a")) == ["x"], "children after the removal")
    check((TreeEvent.NODE_UPDATED, ROOT + "/a/x") in events, "the update's event")
    check((TreeEvent.NODE_ADDED, ROOT + "/a/y") in events, "the addition's event")
    cache.close()
    writer.stop()
    reader.stop()


def lease():
    """NonBlockingLease: one holder until its duration has passed, then
    another; MultiNonBlockingLease: at most its count at once."""
    import datetime
    a, b = client(), client()
    dur = datetime.timedelta(seconds=30)
    # The recipe's clock is the client's (to the second); b's runs a
    # minute ahead where the lease must have run out.
    later = lambda: datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) + datetime.timedelta(minutes=1)
    check(bool(NonBlockingLease(a, ROOT + "/lease", dur, identifier="a")), "a takes the lease")
    check(not NonBlockingLease(b, ROOT + "/lease", dur, identifier="b"), "b takes the lease a holds")
    check(bool(NonBlockingLease(a, ROOT + "/lease", dur, identifier="a")), "a renews its lease")
    check(bool(NonBlockingLease(b, ROOT + "/lease", dur, identifier="b", utcnow=later)), "b takes the lease once a's ran out")
    check(not NonBlockingLease(a, ROOT + "/lease", dur, identifier="a"), "a takes the lease b holds")
    got = [bool(MultiNonBlockingLease(c, 2, ROOT + "/multi", datetime.timedelta(seconds=30), identifier=i))
           for c, i in ((a, "a"), (b, "b"), (client(), "c"))]
    check(got == [True, True, False], "two leases of two, not a third: %r" % got)
    a.stop()
    b.stop()


CASES = {
    "tree-cache": tree_cache,
    "lease": lease,
    "hold-lock": hold_lock,
    "failover-waiter": failover_waiter,
    "failover-holder": failover_holder,
    "failover-contender": failover_contender,
    "lock-worker": lock_worker,
    "rwlock": rwlock,
    "semaphore": semaphore,
    "election": election,
    "queue": queue,
    "counter": counter,
    "barrier": barrier,
    "party": party,
    "partitioner": partitioner,
    "hold-ephemeral": hold_ephemeral,
    "watches": watches,
}

if __name__ == "__main__":
    CASES[CASE](*ARGS)
    print("ok", flush=True)
