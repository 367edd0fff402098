package fsm

import "github.com/tenure-io/tenure/internal/fsm/fsmpb"

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
	_, err := setMemberAddr(&s.clientAddrs, c, "a client address", MaxClientAddrs, maxClientAddrLen)
	return Result{Err: err}
}

// ClientAddr is member's Tenure API address ("" unknown).
func (s *State) ClientAddr(member string) string { return s.clientAddrs[member] }
