import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.atomic.AtomicValue;
import org.apache.curator.framework.recipes.atomic.DistributedAtomicLong;
import org.apache.curator.framework.recipes.barriers.DistributedDoubleBarrier;
import org.apache.curator.framework.recipes.cache.CuratorCache;
import org.apache.curator.framework.recipes.cache.CuratorCacheListener;
import org.apache.curator.framework.recipes.cache.PathChildrenCache;
import org.apache.curator.framework.recipes.cache.PathChildrenCacheEvent;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.nodes.PersistentNode;
import org.apache.curator.framework.recipes.nodes.PersistentTtlNode;
import org.apache.curator.framework.recipes.queue.DistributedQueue;
import org.apache.curator.framework.recipes.queue.QueueBuilder;
import org.apache.curator.framework.recipes.queue.QueueConsumer;
import org.apache.curator.framework.recipes.queue.QueueSerializer;
import org.apache.curator.framework.recipes.shared.SharedCount;
import org.apache.curator.framework.recipes.shared.SharedCountListener;
import org.apache.curator.framework.recipes.shared.SharedCountReader;
import org.apache.curator.framework.recipes.shared.VersionedValue;
import org.apache.curator.framework.api.transaction.CuratorTransactionResult;
import org.apache.curator.framework.state.ConnectionState;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.data.Stat;

/**
 * Curator 5.4's recipes, run unmodified against a ZooKeeper server.
 *
 * <p>Usage: Recipes CONNECT ROOT CASE [ARGS...]. Each case uses paths under
 * ROOT only, prints "ok" when every check held, and exits 1 (with the failed
 * check) otherwise. The Go tests in the parent directory compile and start
 * it against ZooKeeper 3.8 and against Tenure.
 */
public final class Recipes {
    static final long WAIT_S = 20; // seconds any awaited condition may take

    static String connect;
    static String root;
    static final List<CuratorFramework> clients = new ArrayList<>();

    public static void main(String[] args) {
        connect = args[0];
        root = args[1];
        String kase = args[2];
        String[] rest = java.util.Arrays.copyOfRange(args, 3, args.length);
        int code = 0;
        try {
            switch (kase) {
                case "mutex-worker": mutexWorker(rest[0], Integer.parseInt(rest[1])); break;
                case "mutex-holder": mutexHolder(rest[0], rest[1]); break;
                case "semaphore": semaphore(); break;
                case "leader-latch": leaderLatch(); break;
                case "leader-selector": leaderSelector(); break;
                case "queue": queue(); break;
                case "shared-count": sharedCount(); break;
                case "path-children-cache": pathChildrenCache(); break;
                case "curator-cache": curatorCache(); break;
                case "ttl": ttl(); break;
                case "persistent-ttl-node": persistentTtlNode(); break;
                case "rwlock": readWriteLock(); break;
                case "atomic-long": atomicLong(); break;
                case "double-barrier": doubleBarrier(); break;
                case "persistent-node": persistentNode(); break;
                default: throw new IllegalArgumentException("no case " + kase);
            }
            System.out.println("ok");
        } catch (Throwable e) {
            e.printStackTrace();
            code = 1;
        }
        for (CuratorFramework c : clients) {
            c.close();
        }
        System.out.flush();
        System.exit(code);
    }

    static CuratorFramework client() throws InterruptedException {
        CuratorFramework c = CuratorFrameworkFactory.newClient(connect, 10000, 10000, new ExponentialBackoffRetry(100, 5));
        c.start();
        check(c.blockUntilConnected((int) WAIT_S, TimeUnit.SECONDS), "connected to " + connect);
        clients.add(c);
        return c;
    }

    static void check(boolean cond, String what) {
        if (!cond) {
            throw new AssertionError(what);
        }
    }

    static void waitUntil(BooleanSupplier cond, String what) throws InterruptedException {
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(WAIT_S);
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() > end) {
                throw new AssertionError("not within " + WAIT_S + "s: " + what);
            }
            Thread.sleep(10);
        }
    }

    static void appendLine(String log, String line) throws Exception {
        Files.write(Paths.get(log), (line + "\n").getBytes(StandardCharsets.UTF_8),
            StandardOpenOption.CREATE, StandardOpenOption.APPEND, StandardOpenOption.WRITE);
    }

    static String lastLine(String log) throws Exception {
        List<String> lines = Files.readAllLines(Paths.get(log));
        return lines.isEmpty() ? "" : lines.get(lines.size() - 1);
    }

    /** Takes the mutex `rounds` times; inside, the log's last line must be its own "enter". */
    static void mutexWorker(String log, int rounds) throws Exception {
        String me = Long.toString(ProcessHandle.current().pid());
        InterProcessMutex m = new InterProcessMutex(client(), root + "/mutex");
        for (int i = 0; i < rounds; i++) {
            check(m.acquire(WAIT_S * 3, TimeUnit.SECONDS), "acquire");
            try {
                appendLine(log, "enter " + me);
                Thread.sleep(10);
                check(lastLine(log).equals("enter " + me), "another holder wrote inside the mutex");
                // Reentrant: a second acquire by the holder does not block.
                check(m.acquire(1, TimeUnit.SECONDS), "reentrant acquire");
                m.release();
                appendLine(log, "exit " + me);
            } finally {
                m.release();
            }
        }
    }

    /**
     * Queues for the mutex, writes "acquired NAME" to the log once it holds it,
     * and releases it when the file LOG.release-NAME appears.
     */
    static void mutexHolder(String log, String name) throws Exception {
        InterProcessMutex m = new InterProcessMutex(client(), root + "/fifo");
        System.out.println("queued");
        check(m.acquire(WAIT_S * 3, TimeUnit.SECONDS), "acquire");
        appendLine(log, "acquired " + name);
        Path release = Paths.get(log + ".release-" + name);
        waitUntil(() -> Files.exists(release), "release file " + release);
        m.release();
    }

    static void semaphore() throws Exception {
        String path = root + "/semaphore";
        InterProcessSemaphoreV2 s1 = new InterProcessSemaphoreV2(client(), path, 2);
        InterProcessSemaphoreV2 s2 = new InterProcessSemaphoreV2(client(), path, 2);
        InterProcessSemaphoreV2 s3 = new InterProcessSemaphoreV2(client(), path, 2);
        Lease a = s1.acquire(WAIT_S, TimeUnit.SECONDS);
        Lease b = s2.acquire(WAIT_S, TimeUnit.SECONDS);
        check(a != null && b != null, "two leases of two");
        check(s3.acquire(500, TimeUnit.MILLISECONDS) == null, "a third lease of two");
        check(s3.getParticipantNodes().size() == 2, "participants " + s3.getParticipantNodes());
        s1.returnLease(a);
        Lease c = s3.acquire(WAIT_S, TimeUnit.SECONDS);
        check(c != null, "a lease after one was returned");
        s2.returnLease(b);
        s3.returnLease(c);
        // No participants left (the leases node is a container: the server
        // may delete it once empty).
        waitUntil(() -> {
            try {
                return s1.getParticipantNodes().isEmpty();
            } catch (KeeperException.NoNodeException e) {
                return true;
            } catch (Exception e) {
                return false;
            }
        }, "no participants left");
    }

    static void leaderLatch() throws Exception {
        String path = root + "/latch";
        LeaderLatch a = new LeaderLatch(client(), path, "a");
        a.start();
        check(a.await(WAIT_S, TimeUnit.SECONDS), "a leads");
        LeaderLatch b = new LeaderLatch(client(), path, "b");
        b.start();
        check(!b.await(500, TimeUnit.MILLISECONDS), "b leads beside a");
        check(a.hasLeadership() && b.getLeader().getId().equals("a"), "b sees a as the leader");
        waitUntil(() -> {
            try {
                return a.getParticipants().size() == 2;
            } catch (Exception e) {
                return false;
            }
        }, "two participants");
        a.close();
        check(b.await(WAIT_S, TimeUnit.SECONDS), "b leads after a closed");
        check(b.getLeader().getId().equals("b"), "leader id " + b.getLeader().getId());
        b.close();
    }

    static void leaderSelector() throws Exception {
        String path = root + "/selector";
        AtomicInteger leaders = new AtomicInteger();
        AtomicInteger most = new AtomicInteger();
        List<String> order = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch[] letGo = {new CountDownLatch(1), new CountDownLatch(1)};
        List<LeaderSelector> selectors = new ArrayList<>();
        for (int i = 0; i < 2; i++) {
            final int me = i;
            LeaderSelector s = new LeaderSelector(client(), path, new LeaderSelectorListenerAdapter() {
                @Override
                public void takeLeadership(CuratorFramework c) throws Exception {
                    most.accumulateAndGet(leaders.incrementAndGet(), Math::max);
                    order.add("s" + me);
                    try {
                        letGo[me].await(WAIT_S * 2, TimeUnit.SECONDS);
                    } finally {
                        leaders.decrementAndGet();
                    }
                }
            });
            s.setId("s" + i);
            selectors.add(s);
        }
        selectors.get(0).start();
        waitUntil(() -> order.size() == 1, "the first selector leads");
        selectors.get(1).start();
        waitUntil(() -> {
            try {
                return selectors.get(0).getParticipants().size() == 2;
            } catch (Exception e) {
                return false;
            }
        }, "two participants");
        check(selectors.get(1).getLeader().getId().equals("s0"), "leader " + selectors.get(1).getLeader().getId());
        letGo[0].countDown();
        waitUntil(() -> order.size() == 2, "the second selector leads after the first let go");
        check(order.equals(List.of("s0", "s1")), "order " + order);
        check(most.get() == 1, "two leaders at once");
        letGo[1].countDown();
        for (LeaderSelector s : selectors) {
            s.close();
        }
    }

    static final QueueSerializer<String> STRINGS = new QueueSerializer<String>() {
        public byte[] serialize(String s) {
            return s.getBytes(StandardCharsets.UTF_8);
        }

        public String deserialize(byte[] b) {
            return new String(b, StandardCharsets.UTF_8);
        }
    };

    static void queue() throws Exception {
        String path = root + "/queue";
        List<String> got = Collections.synchronizedList(new ArrayList<>());
        QueueConsumer<String> consumer = new QueueConsumer<String>() {
            public void consumeMessage(String m) {
                got.add(m);
            }

            public void stateChanged(CuratorFramework c, ConnectionState s) {}
        };
        DistributedQueue<String> producer = QueueBuilder.builder(client(), null, STRINGS, path).buildQueue(); // producer only
        producer.start();
        List<String> sent = new ArrayList<>();
        for (int i = 0; i < 10; i++) {
            sent.add("item-" + i);
            producer.put("item-" + i);
        }
        DistributedQueue<String> q = QueueBuilder.builder(client(), consumer, STRINGS, path).buildQueue();
        q.start();
        waitUntil(() -> got.size() == sent.size(), "all items consumed: " + got);
        check(got.equals(sent), "FIFO order: " + got);
        waitUntil(() -> {
            try {
                return clients.get(0).getChildren().forPath(path).isEmpty();
            } catch (KeeperException.NoNodeException e) {
                return true; // a container the server deleted once empty
            } catch (Exception e) {
                return false;
            }
        }, "queue emptied");
        q.close();
        producer.close();
    }

    static void sharedCount() throws Exception {
        String path = root + "/count";
        SharedCount a = new SharedCount(client(), path, 0);
        SharedCount b = new SharedCount(client(), path, 0);
        List<Integer> seen = Collections.synchronizedList(new ArrayList<>());
        b.addListener(new SharedCountListener() {
            public void countHasChanged(SharedCountReader r, int n) {
                seen.add(n);
            }

            public void stateChanged(CuratorFramework c, ConnectionState s) {}
        });
        a.start();
        b.start();
        check(a.getCount() == 0, "seed");
        a.setCount(5);
        waitUntil(() -> seen.contains(5) && b.getCount() == 5, "b saw 5: " + seen);
        VersionedValue<Integer> stale = a.getVersionedValue();
        check(b.trySetCount(b.getVersionedValue(), 6), "b sets 6 on the current version");
        waitUntil(() -> a.getCount() == 6, "a saw 6");
        check(!a.trySetCount(stale, 7), "a stale version must not set");
        check(a.trySetCount(a.getVersionedValue(), 7), "a sets 7 on the current version");
        waitUntil(() -> b.getCount() == 7, "b saw 7");
        a.close();
        b.close();
    }

    static void pathChildrenCache() throws Exception {
        String path = root + "/cache";
        CuratorFramework writer = client();
        writer.create().creatingParentsIfNeeded().forPath(path + "/before", "b".getBytes());
        List<String> pcc = Collections.synchronizedList(new ArrayList<>());
        PathChildrenCache children = new PathChildrenCache(client(), path, true);
        children.getListenable().addListener((c, e) -> {
            if (e.getType() == PathChildrenCacheEvent.Type.INITIALIZED) {
                pcc.add("INITIALIZED " + e.getInitialData().size());
            } else if (e.getData() != null) {
                pcc.add(e.getType() + " " + e.getData().getPath().substring(path.length())
                    + " " + new String(e.getData().getData(), StandardCharsets.UTF_8));
            }
        });
        children.start(PathChildrenCache.StartMode.POST_INITIALIZED_EVENT);
        waitUntil(() -> pcc.contains("INITIALIZED 1"), "initialized: " + pcc);
        writer.create().forPath(path + "/x", "1".getBytes());
        waitUntil(() -> pcc.contains("CHILD_ADDED /x 1"), "saw /x created: " + pcc);
        writer.setData().forPath(path + "/x", "2".getBytes());
        waitUntil(() -> pcc.contains("CHILD_UPDATED /x 2"), "saw /x changed: " + pcc);
        writer.create().forPath(path + "/x/deep", "d".getBytes());
        writer.delete().deletingChildrenIfNeeded().forPath(path + "/x");
        waitUntil(() -> pcc.contains("CHILD_REMOVED /x 2"), "saw /x deleted: " + pcc);
        check(children.getCurrentData().size() == 1, "PathChildrenCache holds " + children.getCurrentData());
        check(!pcc.contains("CHILD_ADDED /x/deep d"), "PathChildrenCache reported a grandchild: " + pcc);
        children.close();
    }

    /** CuratorCache: a whole tree, on a persistent recursive watch (addWatch). */
    static void curatorCache() throws Exception {
        String path = root + "/cache";
        CuratorFramework writer = client();
        writer.create().creatingParentsIfNeeded().forPath(path + "/before", "b".getBytes());
        List<String> cc = Collections.synchronizedList(new ArrayList<>());
        CuratorCache tree = CuratorCache.build(client(), path);
        tree.listenable().addListener(CuratorCacheListener.builder()
            .forCreates(n -> cc.add("create " + n.getPath().substring(path.length())))
            .forChanges((o, n) -> cc.add("change " + n.getPath().substring(path.length()) + " "
                + new String(n.getData(), StandardCharsets.UTF_8)))
            .forDeletes(o -> cc.add("delete " + o.getPath().substring(path.length())))
            .forInitialized(() -> cc.add("initialized"))
            .build());
        tree.start();
        waitUntil(() -> cc.contains("initialized") && cc.contains("create /before"), "initialized: " + cc);
        writer.create().forPath(path + "/x", "1".getBytes());
        waitUntil(() -> cc.contains("create /x"), "saw /x created: " + cc);
        writer.setData().forPath(path + "/x", "2".getBytes());
        waitUntil(() -> cc.contains("change /x 2"), "saw /x changed: " + cc);
        writer.create().forPath(path + "/x/deep", "d".getBytes());
        waitUntil(() -> cc.contains("create /x/deep"), "saw a grandchild: " + cc);
        writer.delete().deletingChildrenIfNeeded().forPath(path + "/x");
        waitUntil(() -> cc.contains("delete /x") && cc.contains("delete /x/deep"), "saw /x deleted: " + cc);
        check(tree.get(path + "/before").isPresent() && !tree.get(path + "/x").isPresent(), "CuratorCache contents");
        tree.close();
    }

    static boolean exists(CuratorFramework c, String path) {
        try {
            return c.checkExists().forPath(path) != null;
        } catch (Exception e) {
            throw new RuntimeException(e);
        }
    }

    /**
     * TTL nodes: create().withTtl() with PERSISTENT_WITH_TTL and
     * PERSISTENT_SEQUENTIAL_WITH_TTL, in a transaction too; ephemeralOwner
     * 0; the short-lived ones removed by the server, the long-lived one kept.
     */
    static void ttl() throws Exception {
        CuratorFramework c = client();
        c.create().creatingParentsIfNeeded().forPath(root);
        String longPath = c.create().withTtl(600000).withMode(CreateMode.PERSISTENT_WITH_TTL)
            .forPath(root + "/long", "v".getBytes(StandardCharsets.UTF_8));
        check(longPath.equals(root + "/long"), "created " + longPath);
        Stat st = c.checkExists().forPath(longPath);
        check(st != null && st.getEphemeralOwner() == 0, "a TTL node's ephemeralOwner is 0: " + st);
        String seq = c.create().withTtl(500).withMode(CreateMode.PERSISTENT_SEQUENTIAL_WITH_TTL)
            .forPath(root + "/short-", "s".getBytes(StandardCharsets.UTF_8));
        check(seq.matches(java.util.regex.Pattern.quote(root + "/short-") + "[0-9]{10}"), "sequential TTL node " + seq);
        List<CuratorTransactionResult> res = c.transaction().forOperations(
            c.transactionOp().create().withTtl(500).withMode(CreateMode.PERSISTENT_WITH_TTL)
                .forPath(root + "/tx", "t".getBytes(StandardCharsets.UTF_8)),
            c.transactionOp().check().forPath(longPath));
        // (Curator reports no result path for a createTTL of a transaction.)
        check(res.size() == 2 && res.get(0).getForPath().equals(root + "/tx"), "transaction results " + res);
        check(new String(c.getData().forPath(seq), StandardCharsets.UTF_8).equals("s"), "data of " + seq);
        waitUntil(() -> !exists(c, seq) && !exists(c, root + "/tx"), "the short-lived TTL nodes removed");
        check(exists(c, longPath), "the long-lived TTL node stays");
    }

    /**
     * PersistentTtlNode keeps its node past several TTLs; closed, the node
     * goes (its TTL child expires, then the emptied container).
     */
    static void persistentTtlNode() throws Exception {
        CuratorFramework c = client();
        c.create().creatingParentsIfNeeded().forPath(root);
        String path = root + "/node";
        long ttlMs = 1000;
        PersistentTtlNode n = new PersistentTtlNode(c, path, ttlMs, "data".getBytes(StandardCharsets.UTF_8));
        n.start();
        check(n.waitForInitialCreate(WAIT_S, TimeUnit.SECONDS), "initial create");
        String touch = path + "/" + PersistentTtlNode.DEFAULT_CHILD_NODE_NAME;
        waitUntil(() -> exists(c, touch), "the recipe's TTL child " + touch);
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(4 * ttlMs);
        while (System.nanoTime() < end) {
            check(exists(c, path) && exists(c, touch), "the node and its TTL child alive");
            Thread.sleep(100);
        }
        check(new String(c.getData().forPath(path), StandardCharsets.UTF_8).equals("data"), "the node's data");
        n.close();
        waitUntil(() -> !exists(c, path), "the node removed once the recipe stopped touching it");
    }

    /** Readers share; a writer waits for them and shuts them out while it holds. */
    static void readWriteLock() throws Exception {
        String path = root + "/rw";
        InterProcessReadWriteLock l1 = new InterProcessReadWriteLock(client(), path);
        InterProcessReadWriteLock l2 = new InterProcessReadWriteLock(client(), path);
        InterProcessReadWriteLock l3 = new InterProcessReadWriteLock(client(), path);
        check(l1.readLock().acquire(WAIT_S, TimeUnit.SECONDS), "reader 1");
        check(l2.readLock().acquire(WAIT_S, TimeUnit.SECONDS), "reader 2 beside reader 1");
        check(!l3.writeLock().acquire(500, TimeUnit.MILLISECONDS), "a writer beside two readers");
        l1.readLock().release();
        check(!l3.writeLock().acquire(500, TimeUnit.MILLISECONDS), "a writer beside one reader");
        l2.readLock().release();
        check(l3.writeLock().acquire(WAIT_S, TimeUnit.SECONDS), "the writer once the readers left");
        check(!l1.readLock().acquire(500, TimeUnit.MILLISECONDS), "a reader beside the writer");
        check(!l2.writeLock().acquire(500, TimeUnit.MILLISECONDS), "a second writer");
        l3.writeLock().release();
        check(l1.readLock().acquire(WAIT_S, TimeUnit.SECONDS), "a reader after the writer");
        l1.readLock().release();
    }

    /** Four clients increment one counter 50 times each, by optimistic compare-and-set. */
    static void atomicLong() throws Exception {
        String path = root + "/long";
        int clients = 4, each = 50;
        ExecutorService pool = Executors.newFixedThreadPool(clients);
        List<Future<?>> done = new ArrayList<>();
        for (int i = 0; i < clients; i++) {
            DistributedAtomicLong n = new DistributedAtomicLong(client(), path, new RetryNTimes(1000, 1));
            done.add(pool.submit(() -> {
                for (int k = 0; k < each; k++) {
                    AtomicValue<Long> v = n.increment();
                    check(v.succeeded(), "increment " + k);
                    check(v.postValue() == v.preValue() + 1, "post " + v.postValue() + " after pre " + v.preValue());
                }
                return null;
            }));
        }
        for (Future<?> f : done) {
            f.get(WAIT_S * 3, TimeUnit.SECONDS);
        }
        pool.shutdown();
        DistributedAtomicLong n = new DistributedAtomicLong(client(), path, new RetryNTimes(10, 10));
        check(n.get().postValue() == (long) clients * each, "the count " + n.get().postValue() + ", want " + clients * each);
        check(!n.compareAndSet(0L, 1L).succeeded(), "compareAndSet from a stale value");
        check(n.compareAndSet((long) clients * each, 7L).succeeded(), "compareAndSet from the current value");
        check(n.get().postValue() == 7L, "the value after compareAndSet");
    }

    /** Three members enter together, and leave together. */
    static void doubleBarrier() throws Exception {
        String path = root + "/barrier";
        int members = 3;
        ExecutorService pool = Executors.newFixedThreadPool(members);
        AtomicInteger inside = new AtomicInteger();
        List<Future<?>> done = new ArrayList<>();
        for (int i = 0; i < members; i++) {
            DistributedDoubleBarrier b = new DistributedDoubleBarrier(client(), path, members);
            done.add(pool.submit(() -> {
                check(b.enter(WAIT_S, TimeUnit.SECONDS), "enter");
                check(inside.incrementAndGet() <= members, "inside");
                // Entered: every member is in (the barrier opened for all).
                check(b.leave(WAIT_S, TimeUnit.SECONDS), "leave");
                return null;
            }));
            if (i < members - 1) {
                Thread.sleep(200); // members arrive apart: the first ones wait
                check(inside.get() == 0, "a member passed the barrier before all " + members + " arrived");
            }
        }
        for (Future<?> f : done) {
            f.get(WAIT_S * 2, TimeUnit.SECONDS);
        }
        pool.shutdown();
        check(inside.get() == members, "members through " + inside.get());
    }

    /** A protected PersistentNode (ephemeral) is recreated when another client deletes it. */
    static void persistentNode() throws Exception {
        CuratorFramework c = client();
        CuratorFramework other = client();
        c.create().creatingParentsIfNeeded().forPath(root);
        String path = root + "/member";
        PersistentNode n = new PersistentNode(c, CreateMode.EPHEMERAL, true, path, "me".getBytes(StandardCharsets.UTF_8));
        n.start();
        check(n.waitForInitialCreate(WAIT_S, TimeUnit.SECONDS), "initial create");
        String actual = n.getActualPath();
        check(exists(other, actual), "the node, seen by another client");
        Stat st = other.checkExists().forPath(actual);
        check(st.getEphemeralOwner() == c.getZookeeperClient().getZooKeeper().getSessionId(), "owned by its client's session");
        other.delete().forPath(actual);
        waitUntil(() -> {
            try {
                Stat s2 = other.checkExists().forPath(n.getActualPath());
                return s2 != null && s2.getCzxid() > st.getCzxid();
            } catch (Exception e) {
                return false;
            }
        }, "the node recreated after another client deleted it");
        String last = n.getActualPath();
        check(last.startsWith(root + "/_c_") && last.endsWith("-member"), "a protected name: " + last);
        n.close();
        waitUntil(() -> !exists(other, last), "the node removed once the recipe closed");
    }
}
