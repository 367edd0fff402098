package server

import (
	"context"

	"google.golang.org/protobuf/proto"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
)

// Listings (sessions, locks, a lock's holders and waiters, key ranges,
// dead letters) answer in pages, so that no answer outgrows a client's
// receive limit (gRPC's default is 4 MiB) however much state there is.
const (
	// maxPageItems bounds the items of one list in a page; a request's
	// limit of 0, or above it, means it. A range inside a transaction
	// has the same page (fsm.MaxPageItems).
	maxPageItems = fsm.MaxPageItems
	// maxPageBytes bounds a page's encoded items; a page holds at least
	// one item, so that paging goes on. The largest item (a 1 MiB key
	// value, a session naming maxSessionNames long lock names) is
	// smaller.
	maxPageBytes = fsm.MaxPageBytes
	// maxSessionNames bounds the held and the waited-for locks a session
	// of a listing names (each; all are counted).
	maxSessionNames = 1000
	// maxListedHolders bounds the holders a lock of a listing names (all
	// are counted; LockStatus pages through them all).
	maxListedHolders = 100
)

// pager fills one page: it admits items while the list being paged is
// under its limit and the page under maxPageBytes. A page may hold several
// lists (a lock's holders, then its waiters), which share the bytes.
type pager struct {
	limit, items int  // of the list being paged
	bytes        int  // of the whole page
	any          bool // the page holds an item
	more         bool
}

// list starts a list of at most limit items (0, or above maxPageItems:
// maxPageItems).
func (p *pager) list(limit int64) {
	if limit <= 0 || limit > maxPageItems {
		limit = maxPageItems
	}
	p.limit, p.items, p.more = int(limit), 0, false
}

// take reports whether m fits the page and counts it if so; once an item
// does not fit, more is set and the list is over.
func (p *pager) take(m proto.Message) bool {
	size := proto.Size(m) + 8 // the field's tag and length
	if p.items == p.limit || (p.any && p.bytes+size > maxPageBytes) {
		p.more = true
		return false
	}
	p.items++
	p.bytes += size
	p.any = true
	return true
}

// charge counts m, a field of the page outside its lists, in its bytes.
func (p *pager) charge(m proto.Message) { p.bytes += proto.Size(m) }

// ListSessions implements pb.TenureServer.
func (s *Server) ListSessions(ctx context.Context, req *pb.ListSessionsRequest) (*pb.ListSessionsResponse, error) {
	out := &pb.ListSessionsResponse{}
	var p pager
	p.list(int64(req.GetLimit()))
	err := s.read(ctx, req.GetSerializable(), func(st *fsm.State) {
		out.Revision = st.Revision()
		for v := range st.SessionsAfter(req.GetAfterId(), maxSessionNames) {
			info := &pb.SessionInfo{Id: v.ID, Owner: v.Owner, TtlMs: v.TTLMs, Held: v.Held, Waiting: v.Waiting, HeldCount: uint32(v.HeldCount), WaitingCount: uint32(v.WaitingCount), TimeLeftMs: -1}
			if !p.take(info) {
				break
			}
			out.Sessions = append(out.Sessions, info)
		}
	})
	out.More = p.more
	ids := make([]uint64, len(out.Sessions))
	for i, info := range out.Sessions {
		ids[i] = info.GetId()
	}
	if left, ok := s.node.SessionsTimeLeft(ids); ok {
		for i, d := range left {
			if d >= 0 {
				out.Sessions[i].TimeLeftMs = d.Milliseconds()
			}
		}
	}
	return out, err
}

// ListLocks implements pb.TenureServer.
func (s *Server) ListLocks(ctx context.Context, req *pb.ListLocksRequest) (*pb.ListLocksResponse, error) {
	out := &pb.ListLocksResponse{}
	var p pager
	p.list(int64(req.GetLimit()))
	err := s.read(ctx, req.GetSerializable(), func(st *fsm.State) {
		out.Revision = st.Revision()
		for l := range st.Locks(req.GetPrefix(), req.GetAfter()) {
			sum := &pb.LockSummary{Name: l.Name, Permits: uint32(l.Permits), Holders: uint32(l.Holders), Waiters: uint32(l.Waiters), Delayed: l.Delayed, Kind: l.Kind, DelayMs: l.DelayMs}
			for h := range st.LockHolders(l.Name, 0) {
				if len(sum.FirstHolders) == maxListedHolders {
					break
				}
				sum.FirstHolders = append(sum.FirstHolders, holderToProto(h))
			}
			if !p.take(sum) {
				break
			}
			out.Locks = append(out.Locks, sum)
		}
	})
	out.More = p.more
	return out, err
}

// LockStatus implements pb.TenureServer.
func (s *Server) LockStatus(ctx context.Context, req *pb.LockStatusRequest) (*pb.LockStatusResponse, error) {
	if err := fsm.ValidateName("lock name", req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.LockStatusResponse{Name: req.GetName()}
	var p pager
	err := s.read(ctx, req.GetSerializable(), func(st *fsm.State) {
		out.Revision = st.Revision()
		sum := st.LockSummary(req.GetName())
		out.Delayed, out.Permits = sum.Delayed, uint32(sum.Permits)
		out.HolderCount, out.WaiterCount = uint32(sum.Holders), uint32(sum.Waiters)
		for h := range st.LockHolders(req.GetName(), 0) {
			out.Holder = holderToProto(h) // the first, on every page
			p.charge(out.Holder)
			break
		}
		p.list(int64(req.GetLimit()))
		for h := range st.LockHolders(req.GetName(), req.GetHoldersAfter()) {
			ph := holderToProto(h)
			if !p.take(ph) {
				break
			}
			out.Holders = append(out.Holders, ph)
		}
		out.MoreHolders = p.more
		p.list(int64(req.GetLimit()))
		for w := range st.LockWaiters(req.GetName(), req.GetWaitersAfter()) {
			pw := &pb.Waiter{Owner: w.Owner, Session: w.Session, QueuedRevision: w.AcquireRevision, Shared: w.Shared}
			if !p.take(pw) {
				break
			}
			out.Waiters = append(out.Waiters, pw)
		}
		out.MoreWaiters = p.more
	})
	return out, err
}

func holderToProto(h fsm.HolderView) *pb.Holder {
	return &pb.Holder{Owner: h.Owner, Session: h.Session, Token: h.Token, GrantedRevision: h.Token, Shared: h.Shared, Value: h.Value}
}
