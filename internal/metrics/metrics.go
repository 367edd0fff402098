// Package metrics defines Tenure's Prometheus metrics: their names, help
// and label sets (a public contract, documented in docs/monitoring.md),
// and how they are fed.
//
// Nothing here is called from the state machine's Apply. Three kinds of
// feed exist:
//
//   - measurements of work outside the state machine, observed where it
//     happens: an RPC (ObserveRPC), a lock acquisition's wait
//     (ObserveLockWait), a log append and a batch (the node.Observer
//     methods);
//   - the state machine's sizes and cumulative counts, read from the
//     state at each scrape (a Source, which reads fsm.State.Totals,
//     Counters and the queues under the state's read lock, in O(1) apart
//     from the queues);
//   - the Go runtime and process collectors.
//
// Label sets are bounded: kind (4 values), result (4 for fenced writes, 2
// for group-commit waits), method (the RPCs of the API), code (gRPC's
// 17), state (3), queue (at most the configured number of queues, plus
// "" for all the others together) and member (the cluster's members).
// There is no label per lock or per session.
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tenure-io/tenure/internal/fsm"
)

// Metrics holds one process's metrics and the registry that exposes them.
// It is safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	lockWait      map[string]prometheus.Observer // by kind
	rpcRequests   *prometheus.CounterVec
	rpcSeconds    *prometheus.HistogramVec
	forwarded     *prometheus.CounterVec
	logAppend     prometheus.Histogram
	batch         prometheus.Histogram
	commitWaits   map[bool]prometheus.Counter // by gained
	leaderChanges prometheus.Counter

	// mu guards source.
	mu     sync.Mutex
	source Source
}

// Source reads what the state and the node hold at a scrape.
type Source func() Sample

// Sample is what a Source reads.
type Sample struct {
	Totals   fsm.Totals
	Counters fsm.Counters
	// Queues: one per queue with its own label, then (Name "") the sum of
	// all the others, whose OldestReadyAge is the oldest among them.
	Queues   []QueueSample
	Watchers int
	Raft     RaftSample
	// Members: on the leader, every member's health from its view
	// (node.MembersHealth); empty on a follower, which does not watch its
	// peers.
	Members []MemberSample
	// Zk is this node's ZooKeeper front (zeros without one).
	Zk ZkSample
}

// ZkSample is what this node's ZooKeeper front holds (zkapi.Stats).
type ZkSample struct {
	Connections, Relayed    int
	Watches                 int
	WatchBytes, QueuedBytes int64
}

// MemberSample is one member's health from the leader's view.
type MemberSample struct {
	ID          string
	Reachable   bool
	LastContact time.Duration
	Lag         uint64
}

// QueueSample is one queue's (or the other queues') sizes.
type QueueSample struct {
	Name                  string
	Ready, InFlight, Dead int
	// OldestReadyAge is the age of the oldest ready item; negative when
	// none is ready.
	OldestReadyAge time.Duration
}

// RaftSample is raft's view of the node.
type RaftSample struct {
	IsLeader                  bool
	Term                      uint64
	CommitIndex, AppliedIndex uint64
}

// Bucket boundaries, in seconds (commands for batches).
var (
	lockWaitBuckets  = prometheus.ExponentialBuckets(0.0005, 2, 18) // 0.5 ms .. 65 s
	logAppendBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}
	rpcBuckets       = prometheus.ExponentialBuckets(0.0001, 4, 9) // 0.1 ms .. 6.6 s
	batchBuckets     = prometheus.ExponentialBuckets(1, 2, 11)     // 1 .. 1024
)

// Kinds lists the values of the kind label.
var Kinds = []string{fsm.KindMutex, fsm.KindSemaphore, fsm.KindRWLock, fsm.KindElection}

// New returns the metrics of a process, registered with a registry of
// their own, with the Go runtime and process collectors.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), lockWait: make(map[string]prometheus.Observer)}
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tenure_lock_acquire_wait_seconds",
		Help:    "Time from an acquire request's arrival to its grant, by kind of lock (mutex, semaphore, rwlock for a reader, election).",
		Buckets: lockWaitBuckets,
	}, []string{"kind"})
	for _, k := range Kinds {
		m.lockWait[k] = wait.WithLabelValues(k)
	}
	m.rpcRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tenure_rpc_requests_total",
		Help: "RPCs answered, by method and gRPC status code (a stream counts when it ends).",
	}, []string{"method", "code"})
	m.forwarded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tenure_forwarded_requests_total",
		Help: "Requests this member relayed to the leader over the peer port, by method and the gRPC status code answered (a stream counts when it ends).",
	}, []string{"method", "code"})
	m.rpcSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tenure_rpc_duration_seconds",
		Help:    "Time to answer a unary RPC, by method.",
		Buckets: rpcBuckets,
	}, []string{"method"})
	m.logAppend = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tenure_log_append_seconds",
		Help:    "Time of one append to the raft log store, fsync included.",
		Buckets: logAppendBuckets,
	})
	m.batch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tenure_apply_batch_commands",
		Help:    "Commands per log entry written by this node's batcher (on the leader).",
		Buckets: batchBuckets,
	})
	waits := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tenure_group_commit_waits_total",
		Help: "Waits of the leader's batcher for more proposals before writing a batch smaller than the one before (group commit), by result: gained (more came) or missed.",
	}, []string{"result"})
	m.commitWaits = map[bool]prometheus.Counter{true: waits.WithLabelValues("gained"), false: waits.WithLabelValues("missed")}
	m.leaderChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tenure_leader_changes_total",
		Help: "New leaders this node has seen (an election flapping under load shows here first).",
	})
	m.reg.MustRegister(wait, m.rpcRequests, m.rpcSeconds, m.forwarded, m.logAppend, m.batch, waits, m.leaderChanges, stateCollector{m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the registry to expose (e.g. with promhttp).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SetSource sets what the state metrics are read from at each scrape;
// until it is set they are not exposed.
func (m *Metrics) SetSource(src Source) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.source = src
}

// ObserveLockWait records one grant's wait, for a lock of kind (one of
// Kinds).
func (m *Metrics) ObserveLockWait(kind string, d time.Duration) {
	if o := m.lockWait[kind]; o != nil {
		o.Observe(d.Seconds())
	}
}

// ObserveRPC records one answered RPC; d is recorded for unary ones only
// (unary true).
func (m *Metrics) ObserveRPC(method, code string, unary bool, d time.Duration) {
	m.rpcRequests.WithLabelValues(method, code).Inc()
	if unary {
		m.rpcSeconds.WithLabelValues(method).Observe(d.Seconds())
	}
}

// ObserveForwarded counts a request this member forwarded to the leader
// (method, the code it was answered with).
func (m *Metrics) ObserveForwarded(method, code string) {
	m.forwarded.WithLabelValues(method, code).Inc()
}

// LogAppend implements node.Observer.
func (m *Metrics) LogAppend(d time.Duration) { m.logAppend.Observe(d.Seconds()) }

// Batch implements node.Observer.
func (m *Metrics) Batch(n int) { m.batch.Observe(float64(n)) }

// GroupCommitWait implements node.Observer.
func (m *Metrics) GroupCommitWait(gained bool) { m.commitWaits[gained].Inc() }

// LeaderChanged implements node.Observer.
func (m *Metrics) LeaderChanged(string) { m.leaderChanges.Inc() }

// stateCollector exposes a Sample, read at each scrape.
type stateCollector struct{ m *Metrics }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// The metrics read from a Sample.
var (
	descLocksHeld     = desc("tenure_locks_held", "Locks (of every kind) with at least one holder.")
	descLockWaiters   = desc("tenure_lock_waiters", "Acquires queued on all locks.")
	descLockDelays    = desc("tenure_lock_delays_active", "Locks held back by a lock-delay after a holder's session expired.")
	descGrants        = desc("tenure_lock_grants_total", "Grants of locks of every kind, at once or by a hand-off (applied by this node).")
	descHandoffs      = desc("tenure_lock_handoffs_total", "Grants to a waiter when a lock or permit was freed (applied by this node).")
	descSessions      = desc("tenure_sessions", "Live sessions.")
	descExpired       = desc("tenure_session_expired_total", "Sessions that ended by expiry.")
	descClosed        = desc("tenure_session_closed_total", "Sessions that were closed by their client.")
	descFence         = desc("tenure_fence_writes_total", "Fenced writes (puts and deletes) applied, by result: accepted, stale, duplicate (a replayed operation id), invalid (a token never issued, bad arguments).", "result")
	descQueueItems    = desc("tenure_queue_items", "Queue items by state (ready, inflight, dead), per queue for the first queues by name; queue=\"\" sums the others.", "queue", "state")
	descQueueAge      = desc("tenure_queue_oldest_ready_age_seconds", "Age of the oldest ready item, per queue as tenure_queue_items (absent while none is ready).", "queue")
	descRedeliveries  = desc("tenure_queue_redeliveries_total", "Queue deliveries of items delivered before (after a nack, a visibility expiry or the consumer's session end).")
	descDeadLettered  = desc("tenure_queue_dead_lettered_total", "Queue items moved to the dead letters after their last attempt.")
	descKVKeys        = desc("tenure_kv_keys", "Keys in the key-value store.")
	descWatchers      = desc("tenure_watchers", "Open watch streams (KVWatch and Observe) on this node.")
	descIsLeader      = desc("tenure_raft_is_leader", "1 if this node is the raft leader, else 0.")
	descTerm          = desc("tenure_raft_term", "This node's current raft term.")
	descCommitIndex   = desc("tenure_raft_commit_index", "The highest log index this node knows is committed.")
	descAppliedIndex  = desc("tenure_raft_applied_index", "The highest log index this node has applied to its state.")
	descReachable     = desc("tenure_member_reachable", "1 if the member answered the leader's heartbeat within the last few election timeouts, else 0; exported by the leader only, for every member (itself included).", "member")
	descMemberLag     = desc("tenure_member_replication_lag_entries", "Log entries the member is behind the leader's last index, as it last reported; exported by the leader only.", "member")
	descMemberContact = desc("tenure_member_last_contact_seconds", "Time since the member last answered the leader's heartbeat (0 for the leader); exported by the leader only.", "member")
	descZnodes        = desc("tenure_zk_znodes", "ZooKeeper znodes in the store (the root and /zookeeper's three included).")
	descZnodeBytes    = desc("tenure_zk_znode_bytes", "Bytes the znodes count against their quota (1 GiB): paths, data and ACLs.")
	descEphemerals    = desc("tenure_zk_ephemerals", "Ephemeral znodes, owned by a session.")
	descZkConns       = desc("tenure_zk_connections", "ZooKeeper client connections on this node: kind=\"client\" those it serves (a follower's included, which it relays to the leader), kind=\"relayed\" those followers relay to it.", "kind")
	descZkWatches     = desc("tenure_zk_watches", "ZooKeeper watches (one-shot and persistent) registered on this node.")
	descZkWatchBytes  = desc("tenure_zk_watch_bytes", "Bytes the watches on this node count against --zk-max-watch-bytes.")
	descZkQueued      = desc("tenure_zk_queued_bytes", "ZooKeeper answers and events waiting to be written to their clients on this node (at most 256 MiB).")
	stateDescriptions = []*prometheus.Desc{descZnodes, descZnodeBytes, descEphemerals, descZkConns, descZkWatches, descZkWatchBytes, descZkQueued, descLocksHeld, descLockWaiters, descLockDelays, descGrants, descHandoffs, descSessions, descExpired, descClosed, descFence, descQueueItems, descQueueAge, descRedeliveries, descDeadLettered, descKVKeys, descWatchers, descIsLeader, descTerm, descCommitIndex, descAppliedIndex, descReachable, descMemberLag, descMemberContact}
)

// Describe implements prometheus.Collector.
func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range stateDescriptions {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	src := c.m.source
	c.m.mu.Unlock()
	if src == nil {
		return
	}
	s := src()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	t, n := s.Totals, s.Counters
	gauge(descLocksHeld, float64(t.Held))
	gauge(descLockWaiters, float64(t.Waiters))
	gauge(descLockDelays, float64(t.Delayed))
	counter(descGrants, n.Grants)
	counter(descHandoffs, n.Handoffs)
	gauge(descSessions, float64(t.Sessions))
	counter(descExpired, n.SessionsExpired)
	counter(descClosed, n.SessionsClosed)
	counter(descFence, n.FenceAccepted, "accepted")
	counter(descFence, n.FenceStale, "stale")
	counter(descFence, n.FenceDuplicate, "duplicate")
	counter(descFence, n.FenceInvalid, "invalid")
	for _, q := range s.Queues {
		gauge(descQueueItems, float64(q.Ready), q.Name, "ready")
		gauge(descQueueItems, float64(q.InFlight), q.Name, "inflight")
		gauge(descQueueItems, float64(q.Dead), q.Name, "dead")
		if q.OldestReadyAge >= 0 {
			gauge(descQueueAge, q.OldestReadyAge.Seconds(), q.Name)
		}
	}
	counter(descRedeliveries, n.Redeliveries)
	counter(descDeadLettered, n.DeadLettered)
	gauge(descKVKeys, float64(t.Keys))
	gauge(descWatchers, float64(s.Watchers))
	gauge(descZnodes, float64(t.Znodes))
	gauge(descZnodeBytes, float64(t.ZnodeBytes))
	gauge(descEphemerals, float64(t.Ephemerals))
	gauge(descZkConns, float64(s.Zk.Connections), "client")
	gauge(descZkConns, float64(s.Zk.Relayed), "relayed")
	gauge(descZkWatches, float64(s.Zk.Watches))
	gauge(descZkWatchBytes, float64(s.Zk.WatchBytes))
	gauge(descZkQueued, float64(s.Zk.QueuedBytes))
	leader := 0.0
	if s.Raft.IsLeader {
		leader = 1
	}
	gauge(descIsLeader, leader)
	gauge(descTerm, float64(s.Raft.Term))
	gauge(descCommitIndex, float64(s.Raft.CommitIndex))
	gauge(descAppliedIndex, float64(s.Raft.AppliedIndex))
	for _, m := range s.Members {
		up := 0.0
		if m.Reachable {
			up = 1
		}
		gauge(descReachable, up, m.ID)
		gauge(descMemberLag, float64(m.Lag), m.ID)
		gauge(descMemberContact, m.LastContact.Seconds(), m.ID)
	}
}

// Names lists the name of every metric this package defines (not the Go
// runtime's and the process's): the contract docs/monitoring.md
// documents. A test checks that the registry exposes exactly these.
func Names() []string {
	return []string{
		"tenure_lock_acquire_wait_seconds", "tenure_lock_grants_total", "tenure_lock_handoffs_total",
		"tenure_locks_held", "tenure_lock_waiters", "tenure_lock_delays_active",
		"tenure_sessions", "tenure_session_expired_total", "tenure_session_closed_total",
		"tenure_fence_writes_total",
		"tenure_queue_items", "tenure_queue_oldest_ready_age_seconds", "tenure_queue_redeliveries_total", "tenure_queue_dead_lettered_total",
		"tenure_kv_keys", "tenure_watchers",
		"tenure_zk_znodes", "tenure_zk_znode_bytes", "tenure_zk_ephemerals", "tenure_zk_connections", "tenure_zk_watches", "tenure_zk_watch_bytes", "tenure_zk_queued_bytes",
		"tenure_raft_is_leader", "tenure_raft_term", "tenure_raft_commit_index", "tenure_raft_applied_index", "tenure_leader_changes_total",
		"tenure_member_reachable", "tenure_member_replication_lag_entries", "tenure_member_last_contact_seconds",
		"tenure_log_append_seconds", "tenure_apply_batch_commands", "tenure_group_commit_waits_total",
		"tenure_rpc_requests_total", "tenure_rpc_duration_seconds", "tenure_forwarded_requests_total",
	}
}
