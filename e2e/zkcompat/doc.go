// Package zkcompat runs real, unmodified ZooKeeper clients against
// Tenure's ZooKeeper front (`tenure serve --zk-listen`) and, as the
// reference, against ZooKeeper 3.8 itself:
//
//   - Kazoo 2.8's recipes (kazoo/recipes.py, one process per case, several
//     for Lock and the failover): Lock, ReadLock/WriteLock, Semaphore,
//     Election, Queue and LockingQueue, Counter, Barrier and DoubleBarrier,
//     Party and ShallowParty, SetPartitioner, DataWatch and ChildrenWatch,
//     an ephemeral node removed when its killed holder's session expires,
//     and a Lock holder whose member of a three-member cluster is killed.
//   - Curator 5.4's recipes (java/Recipes.java, compiled by TestMain into a
//     temporary directory, each case in JVMs of its own): InterProcessMutex
//     (exclusion across three JVMs, FIFO order), InterProcessSemaphoreV2,
//     LeaderLatch, LeaderSelector, DistributedQueue, SharedCount,
//     PathChildrenCache, CuratorCache; TTL nodes (create().withTtl(),
//     PersistentTtlNode).
//   - zkCli.sh's create/get/set/ls/delete/stat, with their errors and exit
//     codes, and create -t (TTL nodes).
//   - The differential tests (TestDiff*): one sequence of requests sent on
//     the wire (wire_test.go, a minimal client that shows every reply as
//     sent) by two sessions to both servers; the transcripts, with zxids
//     replaced by the order of their first appearance and session ids by
//     which session they are, must be equal.
//
// Each test runs its cases as subtests named after the server: "zookeeper"
// always, "tenure" for the tests named in tenureReady (main_test.go).
// ZooKeeper runs as a process of the tests' own (ZooKeeperServerMain or,
// for the three-member tests, QuorumPeerMain, with a temporary
// configuration on free loopback ports, no admin server), never the
// system's service; tickTime is 1s on both servers (sessions of 2 to 20 s),
// both check containers and TTL nodes every second, and both have TTL
// nodes on (ZooKeeper's standalone server with
// -Dzookeeper.extendedTypesEnabled=true, Tenure with --zk-ttl-nodes).
//
// The clients come from Debian's packages (python3-kazoo, zookeeper,
// libcurator-recipes-java, default-jdk-headless; .ci/setup-zkc.sh installs
// them); the tests fail, naming what is missing, without them. Kazoo is
// run with /usr/bin/python3, Debian's interpreter. Run:
//
//	cd e2e/zkcompat && go test -count=1 -timeout 15m ./...
//
// ZKCOMPAT_TENURE_ALL=1 runs every test against Tenure too;
// ZKCOMPAT_TENURE_BIN names a tenure binary to use instead of the one
// built from ../.. .
//
// A case can also be run by hand against any server:
//
//	/usr/bin/python3 kazoo/recipes.py 127.0.0.1:2181 /try semaphore
//	javac -cp "$CP" -d /tmp/zkc java/Recipes.java
//	java -cp "$CP:/tmp/zkc" Recipes 127.0.0.1:2181 /try leader-latch
//
// where CP lists /usr/share/java/{curator-recipes,curator-framework,
// curator-client,zookeeper,zookeeper-jute,guava,slf4j-api,slf4j-simple}.jar
// (classpath in main_test.go).
//
// It is a module of its own, with no dependencies, so that the main module
// does not grow a ZooKeeper client.
package zkcompat
