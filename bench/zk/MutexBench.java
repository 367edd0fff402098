import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

/**
 * Curator's InterProcessMutex under load, against any ZooKeeper server.
 *
 * <p>Usage: MutexBench CONNECT MODE CLIENTS DURATION_S WARMUP_S ROOT PARENTS
 *
 * <p>Every client is a CuratorFramework of its own (its own connection and
 * session), looping acquire() then release() with hold time zero:
 *
 * <ul>
 *   <li>uncontended: client i locks ROOT/u/i, a lock path of its own;
 *       ops_per_sec counts completed acquire+release cycles.
 *   <li>contended: every client locks ROOT/c; handoffs_per_sec counts
 *       grants to another client than the previous holder.
 * </ul>
 *
 * <p>PARENTS is "containers" (Curator's own way: acquire() creates the lock
 * path and its parents as container znodes when they are missing) or
 * "persistent" (the lock paths are created beforehand as persistent
 * znodes, so that acquire() finds them whatever the server's container
 * policy).
 *
 * <p>Cycles during the first WARMUP_S seconds are not counted. p50_ms and
 * p99_ms are the time spent in acquire(); cycle_p50_ms the whole cycle. It
 * prints one JSON object (errors: failed acquire() or release() calls, the
 * first five printed on stderr) and exits 1 if two clients held the
 * contended lock at once or no cycle completed.
 */
public final class MutexBench {
    public static void main(String[] args) throws Exception {
        java.util.Locale.setDefault(java.util.Locale.ROOT);
        if (args.length != 7) {
            System.err.println("usage: MutexBench CONNECT uncontended|contended CLIENTS DURATION_S WARMUP_S ROOT containers|persistent");
            System.exit(2);
        }
        String connect = args[0];
        String mode = args[1];
        int clients = Integer.parseInt(args[2]);
        double durationS = Double.parseDouble(args[3]);
        double warmupS = Double.parseDouble(args[4]);
        String root = args[5];
        String parents = args[6];
        if (!parents.equals("containers") && !parents.equals("persistent")) {
            System.err.println("parents must be containers or persistent, not " + parents);
            System.exit(2);
        }
        if (!mode.equals("uncontended") && !mode.equals("contended")) {
            System.err.println("mode must be uncontended or contended, not " + mode);
            System.exit(2);
        }
        boolean contended = mode.equals("contended");

        List<CuratorFramework> cfs = new ArrayList<>();
        for (int i = 0; i < clients; i++) {
            CuratorFramework cf = CuratorFrameworkFactory.builder().connectString(connect)
                    .sessionTimeoutMs(10000).connectionTimeoutMs(10000)
                    .retryPolicy(new RetryOneTime(100)).build();
            cf.start();
            if (!cf.blockUntilConnected(30, TimeUnit.SECONDS)) {
                throw new IllegalStateException("client " + i + " did not connect to " + connect);
            }
            cfs.add(cf);
        }

        if (parents.equals("persistent")) {
            for (int i = 0; i < (contended ? 1 : clients); i++) {
                cfs.get(0).create().creatingParentsIfNeeded().forPath(contended ? root + "/c" : root + "/u/" + i);
            }
        }

        // Per client: acquire waits and cycle times (ns) of counted cycles.
        long[][] waits = new long[clients][];
        long[][] cycles = new long[clients][];
        int[] counts = new int[clients];
        AtomicLong handoffs = new AtomicLong();
        AtomicInteger lastHolder = new AtomicInteger(-1);
        AtomicInteger holders = new AtomicInteger();
        AtomicBoolean overlap = new AtomicBoolean();
                AtomicBoolean counting = new AtomicBoolean();
        AtomicBoolean stop = new AtomicBoolean();
        CountDownLatch done = new CountDownLatch(clients);
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < clients; i++) {
            final int id = i;
            final InterProcessMutex m = new InterProcessMutex(cfs.get(i), contended ? root + "/c" : root + "/u/" + i);
            Thread t = new Thread(() -> {
                long[] w = new long[1 << 14];
                long[] c = new long[1 << 14];
                int n = 0;
                try {
                    while (!stop.get()) {
                        long t0 = System.nanoTime();
                        try {
                            m.acquire();
                        } catch (Exception e) {
                            error("acquire", e);
                            continue;
                        }
                        long t1 = System.nanoTime();
                        boolean count = counting.get();
                        if (holders.incrementAndGet() != 1 && contended) {
                            overlap.set(true);
                        }
                        if (count && contended && lastHolder.getAndSet(id) != id) {
                            handoffs.incrementAndGet();
                        } else if (contended) {
                            lastHolder.set(id);
                        }
                        holders.decrementAndGet();
                        try {
                            m.release();
                        } catch (Exception e) {
                            error("release", e);
                            continue;
                        }
                        long t2 = System.nanoTime();
                        if (count) {
                            if (n == w.length) {
                                w = Arrays.copyOf(w, n * 2);
                                c = Arrays.copyOf(c, n * 2);
                            }
                            w[n] = t1 - t0;
                            c[n] = t2 - t0;
                            n++;
                        }
                    }
                } finally {
                    waits[id] = Arrays.copyOf(w, n);
                    cycles[id] = Arrays.copyOf(c, n);
                    counts[id] = n;
                    done.countDown();
                }
            }, "client-" + i);
            threads.add(t);
        }
        for (Thread t : threads) {
            t.start();
        }
        Thread.sleep((long) (warmupS * 1000));
        long start = System.nanoTime();
        counting.set(true);
        Thread.sleep((long) (durationS * 1000));
        counting.set(false);
        long elapsed = System.nanoTime() - start;
        stop.set(true);
        boolean finished = done.await(60, TimeUnit.SECONDS);
        for (CuratorFramework cf : cfs) {
            cf.close();
        }
        if (!finished) {
            System.err.println("clients still in a cycle 60s after the end");
            System.exit(1);
        }

        long total = 0;
        int min = Integer.MAX_VALUE, max = 0;
        for (int n : counts) {
            total += n;
            min = Math.min(min, n);
            max = Math.max(max, n);
        }
        long[] allW = flatten(waits, total);
        long[] allC = flatten(cycles, total);
        double secs = elapsed / 1e9;
        StringBuilder out = new StringBuilder("{");
        out.append("\"mode\":\"").append(mode).append('"');
        out.append(",\"parents\":\"").append(parents).append('"');
        out.append(",\"clients\":").append(clients);
        out.append(",\"duration_s\":").append(String.format("%.3f", secs));
        out.append(",\"ops\":").append(total);
        out.append(",\"ops_per_sec\":").append(String.format("%.1f", total / secs));
        if (contended) {
            out.append(",\"handoffs\":").append(handoffs.get());
            out.append(",\"handoffs_per_sec\":").append(String.format("%.1f", handoffs.get() / secs));
            out.append(",\"fairness_max_over_min\":").append(min == 0 ? "null" : String.format("%.2f", (double) max / min));
        }
        out.append(",\"p50_ms\":").append(ms(pct(allW, 0.50)));
        out.append(",\"p99_ms\":").append(ms(pct(allW, 0.99)));
        out.append(",\"cycle_p50_ms\":").append(ms(pct(allC, 0.50)));
        out.append(",\"cycle_p99_ms\":").append(ms(pct(allC, 0.99)));
        out.append(",\"errors\":").append(errors.get());
        out.append(",\"overlap\":").append(overlap.get());
        out.append('}');
        System.out.println(out);
        System.exit(overlap.get() || total == 0 ? 1 : 0);
    }

    static final AtomicInteger errors = new AtomicInteger();

    /** error counts a failed call and prints the first few. */
    static void error(String op, Exception e) {
        if (errors.incrementAndGet() <= 5) {
            System.err.println(java.time.Instant.now() + " " + Thread.currentThread().getName() + " " + op + ": " + e);
        }
    }

    static long[] flatten(long[][] parts, long total) {
        long[] all = new long[(int) total];
        int k = 0;
        for (long[] p : parts) {
            System.arraycopy(p, 0, all, k, p.length);
            k += p.length;
        }
        Arrays.sort(all);
        return all;
    }

    static long pct(long[] sorted, double q) {
        if (sorted.length == 0) {
            return 0;
        }
        int i = (int) Math.ceil(q * sorted.length) - 1;
        return sorted[Math.max(0, Math.min(i, sorted.length - 1))];
    }

    static String ms(long ns) {
        return String.format("%.2f", ns / 1e6);
    }
}
