package node

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
)

// The data directory's identity
//
// A data directory belongs to one node of one cluster. The file identity,
// at its top, records the node id it was created for (at bootstrap or
// join) and the cluster's id once this node has learned it: the id the
// first leader drew with the first signing key (fsm.Security.ClusterID),
// learned from this node's own state, or, for a node that joins, from the
// first leader that contacts it (see identityStream). It is never changed
// afterwards: a restore with --replace-keys may give the state another
// cluster's id (its proofs verify with the backup's keys), but the raft
// cluster, whose members recognize each other by it, stays the same. The
// file is replaced atomically and durably, like the applied record, and
// carries a CRC-32C.
//
// Open refuses, before it opens or writes anything, a directory recorded
// for another node id (ErrOtherNode); and a node refuses, on its peer
// port, every raft connection from a node of another cluster, before raft
// reads a byte of it (ErrOtherCluster), so that no term, vote, entry or
// snapshot of another cluster is ever written into its directory. A node
// started with --join on a directory that has state stops then, with one
// line naming both clusters, if the refused node is the first to connect
// to it: its data directory is not the one it was meant to join with.
// Otherwise the refusal is only logged (a misconfigured cluster must not
// be able to stop a healthy member by dialing it).
//
// A directory written before the file existed is adopted at its first
// start: the node id is recorded if its raft configuration names it (or
// is empty), and is refused otherwise, as a directory of another node.

var (
	// ErrOtherNode: the data directory was created for another node id;
	// Open refused it without writing into it.
	ErrOtherNode = errors.New("tenure: another node")
	// ErrOtherCluster: the data directory belongs to another cluster than
	// the node that contacted it; nothing of that cluster was written
	// into it.
	ErrOtherCluster = errors.New("tenure: another cluster")
)

// identityFile is the identity's name inside the data directory.
const identityFile = "identity"

// identityMagic starts the identity's single line.
const identityMagic = "tenure-identity-v1"

// identity is the data directory's owner: the node id and the cluster id
// (nil until known). Its methods are safe for concurrent use.
type identity struct {
	path string
	node string
	// kick (capacity 1): the state machine may know the cluster id now.
	kick chan struct{}

	// mu guards cluster and serializes writes of the file.
	mu      sync.Mutex
	cluster []byte
}

func (id *identity) encode(cluster []byte) []byte {
	c := "-"
	if len(cluster) > 0 {
		c = hex.EncodeToString(cluster)
	}
	body := fmt.Sprintf("%s node %q cluster %s", identityMagic, id.node, c)
	return fmt.Appendf(nil, "%s crc32c %08x\n", body, crc32.Checksum([]byte(body), crcTable))
}

// readIdentity reads the identity at path; found is false if there is none.
func readIdentity(path string) (id *identity, found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("node: reading %s: %w", path, err)
	}
	var magic, node, cluster string
	var sum uint32
	id = &identity{path: path, kick: make(chan struct{}, 1)}
	_, err = fmt.Sscanf(string(data), "%s node %q cluster %s crc32c %x\n", &magic, &node, &cluster, &sum)
	if err == nil && magic != identityMagic {
		err = fmt.Errorf("not an identity file (%q)", magic)
	}
	if err == nil && cluster != "-" {
		id.cluster, err = hex.DecodeString(cluster)
	}
	id.node = node
	if err == nil && !bytes.Equal(id.encode(id.cluster), data) {
		err = errors.New("checksum mismatch")
	}
	if err != nil {
		return nil, false, fmt.Errorf("node: %s is damaged (%v): it names the node and cluster this data directory belongs to; if you know them, write it anew by deleting it and starting the node with its own --node-id", path, err)
	}
	return id, true, nil
}

// write records the identity with cluster (nil: not known yet); mu held.
func (id *identity) writeLocked(cluster []byte) error {
	if err := writeFileAtomic(id.path, id.encode(cluster)); err != nil {
		return fmt.Errorf("node: writing %s: %w", id.path, err)
	}
	id.cluster = slices.Clone(cluster)
	return nil
}

// record writes the identity file with what is known now.
func (id *identity) record() error {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.writeLocked(id.cluster)
}

// clusterID is the recorded cluster id, nil before it is known.
func (id *identity) clusterID() []byte {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.cluster
}

// learn records cluster if none is recorded yet, durably before it
// returns; it returns ErrOtherCluster if another one is.
func (id *identity) learn(cluster []byte, from string) error {
	if len(cluster) == 0 {
		return nil
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	switch {
	case len(id.cluster) == 0:
		return id.writeLocked(cluster)
	case !bytes.Equal(id.cluster, cluster):
		return id.otherCluster(cluster, from)
	}
	return nil
}

// otherCluster is the refusal of cluster, met in from; mu held.
func (id *identity) otherCluster(cluster []byte, from string) error {
	dir := filepath.Dir(id.path)
	return fmt.Errorf("%w: data directory %s belongs to node %s of cluster %s, and %s is of cluster %s: refusing it; start this node with its own data directory (an empty one to join cluster %s)",
		ErrOtherCluster, dir, id.node, fsm.ClusterIDString(id.cluster), from, fsm.ClusterIDString(cluster), fsm.ClusterIDString(cluster))
}

// observe is called after the state machine applied entries or restored a
// snapshot: it asks run to record the state's cluster id if none is
// recorded yet. It never blocks.
func (id *identity) observe(sec *fsm.Security) {
	if len(sec.ClusterID) == 0 {
		return
	}
	id.mu.Lock()
	known := len(id.cluster) > 0
	id.mu.Unlock()
	if known {
		return
	}
	select {
	case id.kick <- struct{}{}:
	default:
	}
}

// run records the state's cluster id when observe asks, until quit is
// closed. A failure to write is reported; the next apply tries again.
func (id *identity) run(quit <-chan struct{}, sec func() *fsm.Security, report func(error)) {
	for {
		select {
		case <-quit:
			return
		case <-id.kick:
		}
		id.mu.Lock()
		var err error
		if c := sec().ClusterID; len(id.cluster) == 0 && len(c) > 0 {
			err = id.writeLocked(c)
		}
		id.mu.Unlock()
		if err != nil {
			report(err)
		}
	}
}

// openIdentity reads the data directory's identity and refuses one of
// another node; it writes nothing. A missing identity is returned with
// found false, to be created by createIdentity.
func openIdentity(dataDir, nodeID string) (id *identity, found bool, err error) {
	path := filepath.Join(dataDir, identityFile)
	id, found, err = readIdentity(path)
	if err != nil || !found {
		return &identity{path: path, node: nodeID, kick: make(chan struct{}, 1)}, false, err
	}
	if id.node != nodeID {
		c := "not known yet"
		if len(id.cluster) > 0 {
			c = fsm.ClusterIDString(id.cluster)
		}
		return nil, false, fmt.Errorf("%w: data directory %s belongs to node %s of cluster %s, not --node-id %s: start it with --node-id %s, or give node %s a data directory of its own (an empty one, with --join, to add it to a cluster)",
			ErrOtherNode, dataDir, id.node, c, nodeID, id.node, nodeID)
	}
	return id, true, nil
}

// adopt checks a data directory that has raft state but no identity file
// (written by a release before it): the latest raft configuration must
// name the node, unless it is empty.
func adopt(dataDir, nodeID string, logs raft.LogStore, snaps raft.SnapshotStore) error {
	conf, err := latestConfiguration(logs, snaps)
	if err != nil {
		return err
	}
	if len(conf.Servers) == 0 {
		return nil
	}
	var ids []string
	for _, s := range conf.Servers {
		if string(s.ID) == nodeID {
			return nil
		}
		ids = append(ids, string(s.ID))
	}
	return fmt.Errorf("%w: data directory %s belongs to a cluster whose members are %v, which do not include --node-id %s: start it with its own member's --node-id, or give node %s a data directory of its own (an empty one, with --join, to add it to a cluster)",
		ErrOtherNode, dataDir, ids, nodeID, nodeID)
}

// latestConfiguration is the raft configuration the log and snapshots
// hold last, read without starting raft.
func latestConfiguration(logs raft.LogStore, snaps raft.SnapshotStore) (conf raft.Configuration, err error) {
	metas, err := snaps.List()
	if err != nil {
		return conf, fmt.Errorf("node: listing snapshots: %w", err)
	}
	var after uint64
	if len(metas) > 0 { // newest first
		conf, after = metas[0].Configuration, metas[0].Index
	}
	first, err := logs.FirstIndex()
	if err != nil {
		return conf, fmt.Errorf("node: reading the raft log: %w", err)
	}
	last, err := logs.LastIndex()
	if err != nil {
		return conf, fmt.Errorf("node: reading the raft log: %w", err)
	}
	defer func() {
		if p := recover(); p != nil { // raft.DecodeConfiguration panics on bad bytes
			err = fmt.Errorf("node: a configuration entry of the raft log does not decode: %v", p)
		}
	}()
	for i := max(first, after+1); first > 0 && i <= last; i++ {
		var l raft.Log
		if err := logs.GetLog(i, &l); err != nil {
			return conf, fmt.Errorf("node: reading raft log entry %d: %w", i, err)
		}
		if l.Type == raft.LogConfiguration {
			conf = raft.DecodeConfiguration(l.Data)
		}
	}
	return conf, nil
}

// writeFileAtomic replaces path with data atomically and durably: a
// temporary file, fsync, rename, fsync of the directory.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	err = dir.Sync()
	if cerr := dir.Close(); err == nil {
		err = cerr
	}
	return err
}
