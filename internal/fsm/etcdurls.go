package fsm

import (
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// MaxEtcdURLs bounds the members whose etcd API address the state keeps.
const MaxEtcdURLs = 64

// maxEtcdURLLen bounds one address.
const maxEtcdURLLen = 512

// setEtcdURL records (or, with an empty url, removes) a member's etcd API
// address. It changes the revision only when the address changes.
func (s *State) setEtcdURL(c *fsmpb.SetEtcdURL) Result {
	switch {
	case c.GetMember() == "" || len(c.GetMember()) > MaxNameLen:
		return Result{Err: fmt.Errorf("%w: a member id of 1..%d bytes", ErrInvalid, MaxNameLen)}
	case len(c.GetUrl()) > maxEtcdURLLen:
		return Result{Err: fmt.Errorf("%w: an etcd URL of at most %d bytes", ErrInvalid, maxEtcdURLLen)}
	}
	old, had := s.etcdURLs[c.GetMember()]
	switch {
	case c.GetUrl() == "":
		if had {
			delete(s.etcdURLs, c.GetMember())
			s.bump()
		}
	case old != c.GetUrl():
		if !had && len(s.etcdURLs) >= MaxEtcdURLs {
			return Result{Err: fmt.Errorf("%w: %d members have an etcd URL, the limit is %d", ErrLimit, len(s.etcdURLs), MaxEtcdURLs)}
		}
		if s.etcdURLs == nil {
			s.etcdURLs = make(map[string]string)
		}
		s.etcdURLs[c.GetMember()] = c.GetUrl()
		s.bump()
	}
	return Result{}
}

// EtcdURL is member's etcd API address ("" unknown).
func (s *State) EtcdURL(member string) string { return s.etcdURLs[member] }

// EtcdURLs returns every member's etcd API address.
func (s *State) EtcdURLs() map[string]string {
	out := make(map[string]string, len(s.etcdURLs))
	for k, v := range s.etcdURLs {
		out[k] = v
	}
	return out
}

func exportEtcdURLs(m map[string]string) []*fsmpb.SetEtcdURL {
	var out []*fsmpb.SetEtcdURL
	for _, k := range sortedKeys(m) {
		out = append(out, &fsmpb.SetEtcdURL{Member: k, Url: m[k]})
	}
	return out
}

func importEtcdURLs(in []*fsmpb.SetEtcdURL) map[string]string {
	if len(in) == 0 {
		return nil
	}
	m := make(map[string]string, len(in))
	for _, e := range in {
		m[e.GetMember()] = e.GetUrl()
	}
	return m
}
