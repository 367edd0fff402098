// Package zkcompat runs real, unmodified ZooKeeper clients against
// Tenure's ZooKeeper front (`tenure serve --zk-listen`) and, as the
// reference, against ZooKeeper 3.8 itself: Kazoo's recipes (kazoo/*.py),
// Curator's recipes in separate JVMs (java/*.java, compiled by the tests),
// zkCli.sh, and a differential test that sends one sequence of requests on
// the wire to both servers and compares the answers.
//
// Each test runs its cases as subtests named after the server: "zookeeper"
// always, "tenure" for the tests named in tenureReady (main_test.go).
//
// The clients come from Debian's packages (python3-kazoo, zookeeper,
// libcurator-recipes-java, default-jdk-headless; .ci/setup-zkc.sh installs
// them); the tests fail, naming what is missing, without them. Run:
//
//	cd e2e/zkcompat && go test -count=1 -timeout 15m ./...
//
// It is a module of its own, with no dependencies, so that the main module
// does not grow a ZooKeeper client.
package zkcompat
