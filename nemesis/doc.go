// Package nemesis is Tenure's fault-injection suite. Its tests start a
// 3-node cluster of real `tenure serve` processes on loopback, with a TCP
// proxy on every directed peer link and in front of every node's client
// API, drive lock-and-write workloads from in-process Go clients and from
// `tenure lock` processes, and meanwhile inject faults: SIGSTOP of a lock
// holder for longer than its TTL, kill -9 of the leader or of a follower
// and restart, restart of the whole cluster, network partitions, SIGSTOP
// of a server, client connections that go silent, a full disk, and a log
// corrupted on disk (the node must refuse it, and is rebuilt from its
// peers). Every client operation is recorded with its invocation and
// completion times; the history is written as JSON lines and checked:
//
//   - fenced registers: no write with a token below an accepted one is
//     accepted, accepted tokens strictly increase in commit (revision)
//     order, the final value is the last accepted write, and the history
//     of each register is linearizable (porcupine);
//   - tokens: every grant's token is unique and larger than every token
//     that was observed before the grant was requested, across leader
//     changes and full restarts.
//
// Run it with
//
//	go test ./nemesis/ -run TestNemesis -v -args -duration 2m
//
// The suite builds its own tenure with the tenurefault build tag, which
// adds serve's fault-injection flags (--peer-route, and
// --unsafe-skip-fence-check); a normal build has neither. -short skips the
// package. TestNemesisCatchesBrokenFencing runs the same checker against a
// cluster started with --unsafe-skip-fence-check and requires it to report
// anomalies. docs/nemesis.md describes the faults, the checks and longer
// runs. The package holds no code outside its tests.
package nemesis
