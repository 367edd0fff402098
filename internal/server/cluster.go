package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/node"
)

// memberVersionWait bounds how long a member list waits for the members'
// versions (a member that does not answer in time is listed without).
const memberVersionWait = time.Second

// members lists the configuration, each member with the version it
// reports over its peer listener (node.MemberVersions: a few seconds old
// at most, asked again within memberVersionWait); on the leader also with
// each member's health from its view (node.MembersHealth), which view
// names.
func (s *Server) members(ctx context.Context) (*pb.MemberListResponse, error) {
	hs, known, err := s.node.MembersHealth()
	if err != nil {
		return nil, toStatus(err)
	}
	vctx, cancel := context.WithTimeout(ctx, memberVersionWait)
	ms := make([]node.Member, len(hs))
	for i, h := range hs {
		ms[i] = h.Member
	}
	vs := s.node.MemberVersions(vctx, ms)
	cancel()
	out := &pb.MemberListResponse{}
	if known {
		out.View = s.node.ID()
	}
	s.node.Read(func(st *fsm.State) {
		for _, h := range hs {
			v := vs[h.ID]
			m := &pb.Member{Id: h.ID, PeerAddr: h.PeerAddr, Voter: h.Voter, Leader: h.Leader, ClientAddr: st.ClientAddr(h.ID), Protocol: v.Protocol, Version: v.Release}
			if known {
				m.Reachable, m.LastContactMs, m.MatchIndex, m.Lag = h.Reachable, h.LastContact.Milliseconds(), h.MatchIndex, h.Lag
			}
			out.Members = append(out.Members, m)
		}
	})
	return out, nil
}

func voters(ms []node.Member) int {
	n := 0
	for _, m := range ms {
		if m.Voter {
			n++
		}
	}
	return n
}

// majority is the quorum of n voters.
func majority(n int) int { return n/2 + 1 }

// evenRefusal explains why an even number of voters is refused.
func evenRefusal(after int) error {
	return fmt.Errorf("%w: the change leaves %d voters; an even number tolerates no more failures than one fewer voter but needs a larger quorum (use --force to do it anyway)", fsm.ErrInvalid, after)
}

// quorumRefusal explains why a change that would leave too few reachable
// voters is refused; --force does not override it. down is how many
// voters do not answer now.
func quorumRefusal(change string, reachable, after, need, before, down int) error {
	why := fmt.Sprintf("a majority of the %d voters before the change", before)
	if need > majority(before) {
		why = fmt.Sprintf("a majority of the %d voters after it", after)
	}
	msg := fmt.Sprintf("%s would leave %d reachable voters of %d, but %d must stay reachable (%s)", change, reachable, after, need, why)
	if down > 0 {
		msg += fmt.Sprintf("; %d voters do not answer now", down)
	}
	return fmt.Errorf("%w: %s", fsm.ErrInvalid, msg)
}

// MemberList implements pb.TenureServer.
func (s *Server) MemberList(ctx context.Context, _ *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	return s.members(ctx)
}

// MemberAdd implements pb.TenureServer. Nothing changes before the new
// member's peer answers a raft RPC: the leader waits for that until
// shortly before the request's deadline (awaitPeer). With rebuild, the
// member's old voter entry, if any, is then removed (its data was lost: a
// voter that has forgotten its log and its vote must not count for a
// quorum), checked as MemberRemove checks, and the member is added back
// as below; run again after an interruption it finds the member absent or
// a non-voter and only adds it. The add is refused if the reachable
// voters, the new one included, would be fewer than a majority of the
// voters before or after it. The member joins as a non-voter and is
// promoted once it has caught up (node.AddVoter). Force only allows an
// even number of voters (a rebuild of a voter restores the number it
// began with and needs none).
func (s *Server) MemberAdd(ctx context.Context, req *pb.MemberAddRequest) (*pb.MemberListResponse, error) {
	id, addr := req.GetId(), req.GetPeerAddr()
	if id == "" || addr == "" {
		return nil, toStatus(fmt.Errorf("%w: member add needs an id and a peer address", fsm.ErrInvalid))
	}
	if !s.node.IsLeader() {
		return nil, toStatus(node.ErrNotLeader)
	}
	if req.GetRebuild() && id == s.node.ID() {
		return nil, toStatus(fmt.Errorf("%w: %s is the leader answering this request, so its data is not lost; rebuild another member, or stop this one and rebuild it from the others", fsm.ErrInvalid, id))
	}
	// What can be refused without the new member is refused first: an
	// even number of voters (a rebuild of a voter keeps the number).
	if ms, _, err := s.node.Configuration(); err != nil {
		return nil, toStatus(err)
	} else if _, after := addCounts(ms, id); after%2 == 0 && !req.GetForce() && !(req.GetRebuild() && isVoter(ms, id)) {
		return nil, toStatus(evenRefusal(after))
	}
	if err := s.awaitPeer(ctx, id, addr); err != nil {
		return nil, toStatus(err)
	}
	force := req.GetForce()
	if req.GetRebuild() {
		removed, err := s.removeOldEntry(ctx, id)
		if err != nil {
			return nil, toStatus(err)
		}
		force = force || removed
	}
	ms, index, err := s.node.Configuration()
	if err != nil {
		return nil, toStatus(err)
	}
	up, err := s.node.Reachable(ctx, ms)
	if err != nil {
		return nil, toStatus(err)
	}
	before, after := addCounts(ms, id)
	reachable := len(up) + 1
	if up[id] {
		reachable--
	}
	if need := max(majority(before), majority(after)); reachable < need {
		return nil, toStatus(quorumRefusal("adding "+id, reachable, after, need, before, before-len(up)))
	}
	if after%2 == 0 && !force {
		return nil, toStatus(evenRefusal(after))
	}
	if err := s.node.AddVoter(ctx, id, addr, index); err != nil {
		return nil, toStatus(memberErr(err, ""))
	}
	s.log.Info("member added", "member", id, "peer", addr, "voters", after, "rebuild", req.GetRebuild())
	return s.members(ctx)
}

// addCounts returns the voters of ms, and how many there are once id is a
// voter.
func addCounts(ms []node.Member, id string) (before, after int) {
	before = voters(ms)
	if isVoter(ms, id) {
		return before, before
	}
	return before, before + 1
}

// isVoter reports whether id is a voter of ms.
func isVoter(ms []node.Member, id string) bool {
	for _, m := range ms {
		if m.ID == id && m.Voter {
			return true
		}
	}
	return false
}

// peerPoll is how often awaitPeer asks a new member's peer again.
const peerPoll = 200 * time.Millisecond

// awaitPeer waits until member id's peer answers a raft RPC at addr
// (node.ProbePeer). While nothing listens there (its server is not
// started yet) it asks again every peerPoll, until shortly before ctx's
// deadline: the refusal, which says that nothing changed, must reach the
// caller before its deadline does. A peer that listens but does not
// answer, or not as raft (another protocol, a peer TLS it does not pass),
// is refused at once.
func (s *Server) awaitPeer(ctx context.Context, id, addr string) error {
	if dl, ok := ctx.Deadline(); ok {
		margin := min(time.Until(dl)/10, 2*time.Second)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-margin))
		defer cancel()
	}
	start, logged := time.Now(), false
	tick := time.NewTicker(peerPoll)
	defer tick.Stop()
	for {
		err := s.node.ProbePeer(ctx, id, addr)
		if err == nil {
			return nil
		}
		if !errors.Is(err, node.ErrPeerNotListening) {
			return memberErr(err, fmt.Sprintf("nothing was changed: start its server with --peer-listen %s --join first", addr))
		}
		if !logged {
			logged = true
			s.log.Info("waiting for a new member's peer to listen", "member", id, "peer", addr, "err", err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return memberErr(err, fmt.Sprintf("waited %s for it; nothing was changed: start its server with --peer-listen %s --join first, or give more time (--timeout)", time.Since(start).Round(time.Millisecond), addr))
		}
	}
}

// removeOldEntry removes voter id's entry for a rebuild (refused if the
// reachable voters left would be fewer than a majority of the voters
// before); removed is false when id was no voter (absent, or a non-voter
// left by an interrupted rebuild).
func (s *Server) removeOldEntry(ctx context.Context, id string) (removed bool, err error) {
	ms, index, err := s.node.Configuration()
	if err != nil {
		return false, err
	}
	voter := false
	for _, m := range ms {
		voter = voter || (m.ID == id && m.Voter)
	}
	if !voter {
		return false, nil
	}
	if err := s.checkRemoval(ctx, ms, id, true); err != nil {
		return false, err
	}
	if err := s.node.RemoveServer(ctx, id, index); err != nil {
		return false, err
	}
	s.log.Info("member removed for a rebuild", "member", id)
	return true, nil
}

// checkRemoval refuses the removal of voter id from ms if the reachable
// voters left would be fewer than a majority of the voters before, or
// (unless force) an even number would be left, or none.
func (s *Server) checkRemoval(ctx context.Context, ms []node.Member, id string, force bool) error {
	if voters(ms) == 1 {
		return fmt.Errorf("%w: %s is the cluster's only voter; a cluster needs at least one (to retire it, stop the node instead)", fsm.ErrInvalid, id)
	}
	up, err := s.node.Reachable(ctx, ms)
	if err != nil {
		return err
	}
	before := voters(ms)
	after, reachable := before-1, len(up)
	if up[id] {
		reachable--
	}
	if reachable < majority(before) {
		return quorumRefusal("removing "+id, reachable, after, majority(before), before, before-len(up))
	}
	if after%2 == 0 && after > 0 && !force {
		return evenRefusal(after)
	}
	return nil
}

// MemberRemove implements pb.TenureServer. Removing a voter is refused if
// the reachable voters left would be fewer than a majority of the voters
// before the change. Force only allows an even number of voters.
func (s *Server) MemberRemove(ctx context.Context, req *pb.MemberRemoveRequest) (*pb.MemberListResponse, error) {
	id := req.GetId()
	ms, index, err := s.node.Configuration()
	if err != nil {
		return nil, toStatus(err)
	}
	var target *node.Member
	for i := range ms {
		if ms[i].ID == id {
			target = &ms[i]
		}
	}
	if target == nil {
		return nil, toStatus(fmt.Errorf("%w: no member %q", fsm.ErrInvalid, id))
	}
	if target.Voter {
		if err := s.checkRemoval(ctx, ms, id, req.GetForce()); err != nil {
			return nil, toStatus(err)
		}
	}
	if err := s.node.RemoveServer(ctx, id, index); err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("member removed", "member", id)
	return s.members(ctx)
}

// MemberTransferLeadership implements pb.TenureServer: the leader hands
// leadership to req's voter (or the most up to date one) and answers once
// it no longer leads.
func (s *Server) MemberTransferLeadership(ctx context.Context, req *pb.MemberTransferLeadershipRequest) (*pb.MemberTransferLeadershipResponse, error) {
	leader, err := s.node.TransferLeadership(ctx, req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("leadership transferred", "to", leader)
	return &pb.MemberTransferLeadershipResponse{Leader: leader}, nil
}

// memberErr makes a probe or catch-up failure an INVALID_ARGUMENT that
// says what to do.
func memberErr(err error, todo string) error {
	msg := strings.TrimPrefix(err.Error(), "tenure: ") // one prefix on the line
	switch {
	case errors.Is(err, node.ErrPeerUnreachable):
		return fmt.Errorf("%w: %s; %s", fsm.ErrInvalid, msg, todo)
	case errors.Is(err, node.ErrStandalone), errors.Is(err, node.ErrCatchingUp), errors.Is(err, node.ErrOtherCluster):
		return fmt.Errorf("%w: %s", fsm.ErrInvalid, msg)
	}
	return err
}

// snapshotChunk is the size of the pieces a snapshot is streamed in.
const snapshotChunk = 1 << 20

// SnapshotSave implements pb.TenureServer. The stream is a sealed
// snapshot file (fsm.SealSnapshot), which holds the private signing keys.
func (s *Server) SnapshotSave(_ *pb.SnapshotSaveRequest, stream pb.Tenure_SnapshotSaveServer) error {
	data, err := s.node.SaveSnapshot(stream.Context())
	if err != nil {
		return toStatus(err)
	}
	for len(data) > 0 {
		n := min(len(data), snapshotChunk)
		if err := stream.Send(&pb.SnapshotChunk{Data: data[:n]}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// RestoreLimits bound the snapshot restores one node accepts at once. A
// restore stream is held in memory until it is complete, so these bound
// that memory; they are per node, not replicated.
type RestoreLimits struct {
	// MaxStreams bounds the restore streams open at once
	// (--max-restore-streams).
	MaxStreams int
	// MaxBytes bounds the bytes all open restore streams hold together
	// (--max-restore-bytes); a stream that would pass it is refused at
	// that chunk.
	MaxBytes int64
}

// DefaultRestoreLimits are the restore limits `tenure serve` runs with.
func DefaultRestoreLimits() RestoreLimits { return RestoreLimits{MaxStreams: 1, MaxBytes: 1 << 30} }

func (l RestoreLimits) withDefaults() RestoreLimits {
	d := DefaultRestoreLimits()
	if l.MaxStreams <= 0 {
		l.MaxStreams = d.MaxStreams
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = d.MaxBytes
	}
	return l
}

// restoreGate admits restore streams within RestoreLimits; the zero value
// has nothing admitted. It is safe for concurrent use.
type restoreGate struct {
	streams atomic.Int64 // open streams admitted
	bytes   atomic.Int64 // bytes reserved by them
}

// enter admits one more stream, or refuses past max.
func (g *restoreGate) enter(max int) error {
	if g.streams.Add(1) > int64(max) {
		g.streams.Add(-1)
		return fmt.Errorf("%w: a snapshot restore is already running on this node; the limit is %d concurrent restore streams (--max-restore-streams)", ErrLimit, max)
	}
	return nil
}

func (g *restoreGate) leave() { g.streams.Add(-1) }

// reserve reserves n more bytes, or refuses if the streams together would
// hold more than max.
func (g *restoreGate) reserve(n, max int64) error {
	for {
		cur := g.bytes.Load()
		if cur+n > max {
			return fmt.Errorf("%w: restore streams on this node would hold more than %d bytes (--max-restore-bytes)", ErrLimit, max)
		}
		if g.bytes.CompareAndSwap(cur, cur+n) {
			return nil
		}
	}
}

func (g *restoreGate) release(n int64) { g.bytes.Add(-n) }

// SnapshotRestore implements pb.TenureServer: the options come with the
// first chunk, and node.RestoreSnapshot checks the seal, the cluster and
// the state before anything is replaced (INVALID_ARGUMENT when refused).
func (s *Server) SnapshotRestore(stream pb.Tenure_SnapshotRestoreServer) error {
	lim := s.limits.Restore
	if err := s.restores.enter(lim.MaxStreams); err != nil {
		return toStatus(err)
	}
	defer s.restores.leave()
	var data []byte
	defer func() { s.restores.release(int64(len(data))) }()
	var opt node.RestoreOptions
	for first := true; ; first = false {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if first {
			opt = node.RestoreOptions{Force: c.GetForce(), FromCluster: c.GetFromCluster(), ReplaceKeys: c.GetReplaceKeys(), AboveRevision: c.GetAboveRevision()}
		}
		if err := s.restores.reserve(int64(len(c.GetData())), lim.MaxBytes); err != nil {
			return toStatus(err)
		}
		data = append(data, c.GetData()...)
	}
	snap, err := s.node.RestoreSnapshot(stream.Context(), data, opt)
	if err != nil {
		s.log.Warn("snapshot restore refused", "err", err, "bytes", len(data), "force", opt.Force)
		return toStatus(err)
	}
	s.log.Info("snapshot restored", "revision", snap.GetRevision(), "fence_floor", snap.GetFenceFloor(), "force", opt.Force, "from_cluster", opt.FromCluster, "replace_keys", opt.ReplaceKeys, "bytes", len(data), "sessions", len(snap.GetSessions()), "locks", len(snap.GetLocks()))
	s.node.EnsureSigningKey(stream.Context()) // a snapshot from before keys has none
	return stream.SendAndClose(&pb.SnapshotRestoreResponse{Revision: snap.GetRevision(), Sessions: uint32(len(snap.GetSessions())), Locks: uint32(len(snap.GetLocks())), Registers: uint32(len(snap.GetRegisters())), Queues: uint32(len(snap.GetQueues())), Keys: uint64(len(snap.GetKv()))})
}
