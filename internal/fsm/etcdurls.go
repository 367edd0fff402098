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
	changed, err := setMemberAddr(&s.etcdURLs, c, "an etcd URL", MaxEtcdURLs, maxEtcdURLLen)
	if err != nil {
		return Result{Err: err}
	}
	if changed {
		s.bump()
	}
	return Result{}
}

// setMemberAddr sets (or, with an empty url, removes) member c.Member's
// address in *m, at most limit members and maxLen bytes (what names the
// address in errors), and reports whether *m changed.
func setMemberAddr(m *map[string]string, c *fsmpb.SetEtcdURL, what string, limit, maxLen int) (bool, error) {
	switch {
	case c.GetMember() == "" || len(c.GetMember()) > MaxNameLen:
		return false, fmt.Errorf("%w: a member id of 1..%d bytes", ErrInvalid, MaxNameLen)
	case len(c.GetUrl()) > maxLen:
		return false, fmt.Errorf("%w: %s of at most %d bytes", ErrInvalid, what, maxLen)
	}
	old, had := (*m)[c.GetMember()]
	switch {
	case c.GetUrl() == "":
		delete(*m, c.GetMember())
		return had, nil
	case had && old == c.GetUrl():
		return false, nil
	case !had && len(*m) >= limit:
		return false, fmt.Errorf("%w: %d members have %s, the limit is %d", ErrLimit, len(*m), what, limit)
	}
	if *m == nil {
		*m = make(map[string]string)
	}
	(*m)[c.GetMember()] = c.GetUrl()
	return true, nil
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
