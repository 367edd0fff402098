package fsm

import (
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// MaxClientAddrs bounds the members whose Tenure API address the state
// keeps.
const MaxClientAddrs = 64

// maxClientAddrLen bounds one address.
const maxClientAddrLen = 512

// setClientAddr records (or, with an empty address, removes) the address a
// member's Tenure API is reached at (Url of the command: host:port), so
// that a member can tell clients where every member, and the leader, is.
//
// It never changes the revision: an address is not part of what tokens
// and revisions order, so a replica that does not know this command yet
// (and refuses it without a revision) keeps the same revisions as one that
// applies it.
func (s *State) setClientAddr(c *fsmpb.SetEtcdURL) Result {
	switch {
	case c.GetMember() == "" || len(c.GetMember()) > MaxNameLen:
		return Result{Err: fmt.Errorf("%w: a member id of 1..%d bytes", ErrInvalid, MaxNameLen)}
	case len(c.GetUrl()) > maxClientAddrLen:
		return Result{Err: fmt.Errorf("%w: a client address of at most %d bytes", ErrInvalid, maxClientAddrLen)}
	}
	_, had := s.clientAddrs[c.GetMember()]
	switch {
	case c.GetUrl() == "":
		delete(s.clientAddrs, c.GetMember())
	default:
		if !had && len(s.clientAddrs) >= MaxClientAddrs {
			return Result{Err: fmt.Errorf("%w: %d members have a client address, the limit is %d", ErrLimit, len(s.clientAddrs), MaxClientAddrs)}
		}
		if s.clientAddrs == nil {
			s.clientAddrs = make(map[string]string)
		}
		s.clientAddrs[c.GetMember()] = c.GetUrl()
	}
	return Result{}
}

// ClientAddr is member's Tenure API address ("" unknown).
func (s *State) ClientAddr(member string) string { return s.clientAddrs[member] }
