package fsm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// ACLs: policies, tokens and certificate identities, replicated.
//
// A policy is a list of rules, each a resource kind, a name prefix and an
// access (read, write or deny). For a request on a name of a kind, the
// rules of the caller's policies of that kind whose prefix starts the
// name are considered, and the longest prefix wins; rules of equal prefix
// merge, deny first, then the larger of read and write. Nothing matching
// is deny. Write includes read.
//
// A token carries policies; the state keeps its id and the SHA-256 of its
// secret, never the secret, which the proposer draws and hands to the
// client alone. A binding gives a certificate identity (a name in a
// verified client certificate: its common name or a subject alternative
// name) policies too.
//
// The ACL state is replaced, never changed in place (copy on write), so
// that FSM can publish it to readers without a lock (FSM.Security).

// Kind is a resource kind of a rule.
type Kind string

// The resource kinds.
const (
	// KindLock covers locks, semaphores, read-write locks and elections.
	KindLock    Kind = "lock"
	KindFence   Kind = "fence"
	KindQueue   Kind = "queue"
	KindKV      Kind = "kv"
	KindSession Kind = "session"
	// KindCluster: the cluster itself (status, membership, snapshots,
	// limits, ACLs, keys); its rules' prefix is always "".
	KindCluster Kind = "cluster"
)

// Kinds lists every resource kind.
var Kinds = []Kind{KindLock, KindFence, KindQueue, KindKV, KindSession, KindCluster}

// Access is what a rule allows.
type Access uint8

// The accesses, in the order rules of equal prefix merge (deny wins).
const (
	AccessNone Access = iota
	AccessRead
	AccessWrite
	AccessDeny
)

// ParseAccess parses "read", "write" or "deny".
func ParseAccess(s string) (Access, bool) {
	switch s {
	case "read":
		return AccessRead, true
	case "write":
		return AccessWrite, true
	case "deny":
		return AccessDeny, true
	}
	return AccessNone, false
}

func (a Access) String() string {
	switch a {
	case AccessRead:
		return "read"
	case AccessWrite:
		return "write"
	case AccessDeny:
		return "deny"
	}
	return "none"
}

// grants reports whether a rule's access a allows need (read or write).
func (a Access) grants(need Access) bool {
	return a == AccessWrite || (a == AccessRead && need == AccessRead)
}

// merge combines the accesses of two rules of the same prefix.
func merge(a, b Access) Access {
	if a == AccessDeny || b == AccessDeny {
		return AccessDeny
	}
	return max(a, b)
}

// Rule is one rule of a policy.
type Rule struct {
	Kind   Kind
	Prefix string
	Access Access
}

func (r Rule) String() string { return fmt.Sprintf("%s:%s:%s", r.Kind, r.Prefix, r.Access) }

// Policy is a named list of rules.
type Policy struct {
	Name  string
	Rules []Rule
}

// Token is an auth token as the state keeps it.
type Token struct {
	ID          string
	SecretHash  []byte
	Policies    []string
	Description string
	// CreateRevision is the revision of its creation.
	CreateRevision uint64
}

// Binding gives the certificate identity Name policies.
type Binding struct {
	Name     string
	Policies []string
}

// SigningKey is one of the cluster's fence proof keys (see keys.go).
type SigningKey struct {
	ID             string
	Seed           []byte // ed25519 seed
	CreateRevision uint64
	// RetiredRevision is the revision that retired it (0: not retired);
	// RetireGrace is how long after that the leader removes it.
	RetiredRevision uint64
	RetireGrace     time.Duration
}

// Security is the replicated ACL state and the cluster's identity. It is
// immutable: every change makes a new one.
type Security struct {
	// Bootstrapped: AclBootstrap has run (it runs once).
	Bootstrapped bool
	// Enforced: every member enforces the ACLs, whether or not it was
	// started with --auth (AclEnable or AclBootstrap has run). Once set it
	// stays set: no command clears it.
	Enforced bool
	policies map[string]*Policy
	tokens   map[string]*Token // by id
	byHash   map[string]*Token // by hex SHA-256 of the secret
	bindings map[string]*Binding
	// ClusterID is drawn with the first signing key; nil before.
	ClusterID []byte
	// Keys are the signing keys, oldest first; the last signs.
	Keys []SigningKey
}

// ACL bounds: every table has one, and deletes shrink it.
const (
	MaxPolicies       = 1_000
	MaxRulesPerPolicy = 256
	MaxTokens         = 100_000
	MaxBindings       = 10_000
	MaxPoliciesPerRef = 32 // policies of one token or binding
	MaxSigningKeys    = 16
	maxACLName        = 128
	maxDescription    = 256
)

// ManagementPolicy is the policy bootstrap creates: write on every kind
// and name. It cannot be deleted.
const ManagementPolicy = "management"

func emptySecurity() *Security {
	return &Security{policies: map[string]*Policy{}, tokens: map[string]*Token{}, byHash: map[string]*Token{}, bindings: map[string]*Binding{}}
}

// clone copies the maps (the values are never changed in place).
func (sec *Security) clone() *Security {
	c := *sec
	c.policies = make(map[string]*Policy, len(sec.policies))
	for k, v := range sec.policies {
		c.policies[k] = v
	}
	c.tokens = make(map[string]*Token, len(sec.tokens))
	c.byHash = make(map[string]*Token, len(sec.byHash))
	for k, v := range sec.tokens {
		c.tokens[k] = v
		c.byHash[hex.EncodeToString(v.SecretHash)] = v
	}
	c.bindings = make(map[string]*Binding, len(sec.bindings))
	for k, v := range sec.bindings {
		c.bindings[k] = v
	}
	c.Keys = append([]SigningKey(nil), sec.Keys...)
	return &c
}

// HashToken is what the state keeps of a token secret: its SHA-256.
func HashToken(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// TokenBySecret returns the token whose secret is secret.
func (sec *Security) TokenBySecret(secret string) (*Token, bool) {
	t, ok := sec.byHash[hex.EncodeToString(HashToken(secret))]
	return t, ok
}

// Binding returns the binding of a certificate identity name.
func (sec *Security) Binding(name string) (*Binding, bool) {
	b, ok := sec.bindings[name]
	return b, ok
}

// Policies lists the policies by name.
func (sec *Security) Policies() []*Policy {
	out := make([]*Policy, 0, len(sec.policies))
	for _, name := range slices.Sorted(maps.Keys(sec.policies)) {
		out = append(out, sec.policies[name])
	}
	return out
}

// Tokens lists the tokens by id.
func (sec *Security) Tokens() []*Token {
	out := make([]*Token, 0, len(sec.tokens))
	for _, id := range slices.Sorted(maps.Keys(sec.tokens)) {
		out = append(out, sec.tokens[id])
	}
	return out
}

// Bindings lists the bindings by name.
func (sec *Security) Bindings() []*Binding {
	out := make([]*Binding, 0, len(sec.bindings))
	for _, name := range slices.Sorted(maps.Keys(sec.bindings)) {
		out = append(out, sec.bindings[name])
	}
	return out
}

// Access returns what the policies named policies grant on name of kind:
// the merged access of the longest matching prefix (AccessNone: no rule
// matches). Unknown policy names grant nothing.
func (sec *Security) Access(policies []string, kind Kind, name string) Access {
	best, bestLen := AccessNone, -1
	for _, pn := range policies {
		p := sec.policies[pn]
		if p == nil {
			continue
		}
		for _, r := range p.Rules {
			if r.Kind != kind || !strings.HasPrefix(name, r.Prefix) {
				continue
			}
			switch {
			case len(r.Prefix) > bestLen:
				best, bestLen = r.Access, len(r.Prefix)
			case len(r.Prefix) == bestLen:
				best = merge(best, r.Access)
			}
		}
	}
	return best
}

// Allowed reports whether policies grant need (read or write) on name of
// kind.
func (sec *Security) Allowed(policies []string, kind Kind, name string, need Access) bool {
	return sec.Access(policies, kind, name).grants(need)
}

// AllowedUnder reports whether policies grant need on every name of kind
// that starts with prefix: on prefix itself, and under every longer rule
// that starts with it (a listing or a prefix delete of "jobs/" must not
// reach "jobs/secret/" if a rule denies that).
func (sec *Security) AllowedUnder(policies []string, kind Kind, prefix string, need Access) bool {
	if !sec.Allowed(policies, kind, prefix, need) {
		return false
	}
	for _, pn := range policies {
		p := sec.policies[pn]
		if p == nil {
			continue
		}
		for _, r := range p.Rules {
			if r.Kind == kind && len(r.Prefix) > len(prefix) && strings.HasPrefix(r.Prefix, prefix) && !sec.Allowed(policies, kind, r.Prefix, need) {
				return false
			}
		}
	}
	return true
}

// ParseRule parses KIND:PREFIX:ACCESS (the prefix may contain colons;
// an empty prefix is every name).
func ParseRule(s string) (Rule, error) {
	kind, rest, ok := strings.Cut(s, ":")
	i := strings.LastIndexByte(rest, ':')
	if !ok || i < 0 {
		return Rule{}, fmt.Errorf("%w: rule %q is not KIND:PREFIX:ACCESS", ErrInvalid, s)
	}
	acc, ok := ParseAccess(rest[i+1:])
	if !ok {
		return Rule{}, fmt.Errorf("%w: rule %q: access must be read, write or deny", ErrInvalid, s)
	}
	r := Rule{Kind: Kind(kind), Prefix: rest[:i], Access: acc}
	return r, validateRule(r)
}

func validateRule(r Rule) error {
	known := false
	for _, k := range Kinds {
		known = known || r.Kind == k
	}
	switch {
	case !known:
		return fmt.Errorf("%w: rule %s: kind %q is not one of lock, fence, queue, kv, session, cluster", ErrInvalid, r, r.Kind)
	case r.Access < AccessRead || r.Access > AccessDeny:
		return fmt.Errorf("%w: rule %s: access must be read, write or deny", ErrInvalid, r)
	case r.Kind == KindCluster && r.Prefix != "":
		return fmt.Errorf("%w: rule %s: a cluster rule has no prefix (cluster::read, cluster::write)", ErrInvalid, r)
	case len(r.Prefix) > MaxNameLen:
		return fmt.Errorf("%w: rule %s: the prefix is %d bytes, the limit is %d", ErrInvalid, r, len(r.Prefix), MaxNameLen)
	case !utf8.ValidString(r.Prefix):
		return fmt.Errorf("%w: rule %s: the prefix is not valid UTF-8", ErrInvalid, r)
	}
	return nil
}

// ValidateACLName checks a policy name or token id: 1..128 bytes of
// letters, digits, '-', '_' and '.'.
func ValidateACLName(what, name string) error {
	if name == "" || len(name) > maxACLName {
		return fmt.Errorf("%w: %s must be 1..%d bytes", ErrInvalid, what, maxACLName)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%w: %s %q may hold only letters, digits, '-', '_' and '.'", ErrInvalid, what, name)
		}
	}
	return nil
}

// validateIdentityName checks a certificate identity: 1..512 bytes of
// UTF-8 (a common name or subject alternative name).
func validateIdentityName(name string) error {
	if name == "" || len(name) > MaxNameLen || !utf8.ValidString(name) {
		return fmt.Errorf("%w: a certificate identity must be 1..%d bytes of UTF-8", ErrInvalid, MaxNameLen)
	}
	return nil
}

// checkRefs checks a token's or binding's policy list: 1..32 names of
// existing policies, none twice.
func (sec *Security) checkRefs(policies []string) error {
	if len(policies) == 0 || len(policies) > MaxPoliciesPerRef {
		return fmt.Errorf("%w: give 1..%d policies", ErrInvalid, MaxPoliciesPerRef)
	}
	seen := map[string]bool{}
	for _, p := range policies {
		if sec.policies[p] == nil {
			return fmt.Errorf("%w: no policy %q (create it first: tenure acl policy create)", ErrInvalid, p)
		}
		if seen[p] {
			return fmt.Errorf("%w: policy %q given twice", ErrInvalid, p)
		}
		seen[p] = true
	}
	return nil
}

// Security returns the state's ACLs and cluster identity (immutable).
func (s *State) Security() *Security { return s.sec }

// SessionIdentity returns the identity that created session id ("" for
// one created without auth).
func (s *State) SessionIdentity(id uint64) (string, bool) {
	ss, ok := s.sessions[id]
	if !ok {
		return "", false
	}
	return ss.identity, true
}

func (s *State) aclBootstrap(c *fsmpb.AclBootstrap) Result {
	if s.sec.Bootstrapped {
		return Result{Err: fmt.Errorf("%w: the ACLs were bootstrapped already (bootstrap runs once per cluster)", ErrPermissionDenied)}
	}
	rules := make([]Rule, 0, len(Kinds))
	for _, k := range Kinds {
		rules = append(rules, Rule{Kind: k, Access: AccessWrite})
	}
	sec := s.sec.clone()
	sec.Bootstrapped = true
	// Bootstrapping the ACLs puts them in force on every member: a token
	// with the management policy must not be needed on some members and
	// be mintable anonymously through others.
	sec.Enforced = s.at(2) // before version 2 each member enforces as its --auth says (version.go)
	sec.policies[ManagementPolicy] = &Policy{Name: ManagementPolicy, Rules: rules}
	if c.GetToken() == nil {
		return Result{Err: fmt.Errorf("%w: bootstrap without a token", ErrInvalid)}
	}
	tok := proto.Clone(c.GetToken()).(*fsmpb.AclToken) // the command is not changed
	tok.Policies = []string{ManagementPolicy}
	if r := s.addToken(sec, tok); r.Err != nil {
		return r
	}
	s.sec = sec
	return Result{}
}

// aclEnable makes the cluster enforce its ACLs; it changes nothing (and
// does not move the revision) when they are enforced already.
func (s *State) aclEnable() Result {
	if s.sec.Enforced {
		return Result{}
	}
	s.bump()
	sec := s.sec.clone()
	sec.Enforced = true
	s.sec = sec
	return Result{}
}

func (s *State) aclPolicySet(c *fsmpb.AclPolicySet) Result {
	if n := len(c.GetPolicy().GetRules()); n == 0 && !s.at(2) {
		// A policy with no rules (an etcd role with no permission) came
		// with version 2 (version.go).
		return Result{Err: fmt.Errorf("%w: a policy has 1..%d rules, not %d", ErrInvalid, MaxRulesPerPolicy, n)}
	}
	p, err := policyFromProto(c.GetPolicy())
	if err != nil {
		return Result{Err: err}
	}
	_, exists := s.sec.policies[p.Name]
	switch {
	case p.Name == ManagementPolicy:
		return Result{Err: fmt.Errorf("%w: the policy %q is built in and cannot be changed", ErrInvalid, ManagementPolicy)}
	case exists && !c.GetReplace():
		return Result{Err: fmt.Errorf("%w: policy %q exists (replace it with --replace)", ErrInvalid, p.Name)}
	case !exists && len(s.sec.policies) >= MaxPolicies:
		return Result{Err: fmt.Errorf("%w: policies: %d, the limit is %d", ErrLimit, len(s.sec.policies), MaxPolicies)}
	}
	s.bump()
	sec := s.sec.clone()
	sec.policies[p.Name] = p
	s.sec = sec
	return Result{}
}

func (s *State) aclPolicyDelete(c *fsmpb.AclPolicyDelete) Result {
	name := c.GetName()
	if s.sec.policies[name] == nil {
		return Result{Err: fmt.Errorf("%w: no policy %q", ErrInvalid, name)}
	}
	if name == ManagementPolicy {
		return Result{Err: fmt.Errorf("%w: the policy %q is built in and cannot be deleted", ErrInvalid, ManagementPolicy)}
	}
	var users []string
	for _, id := range slices.Sorted(maps.Keys(s.sec.tokens)) {
		if contains(s.sec.tokens[id].Policies, name) {
			users = append(users, "token "+id)
		}
	}
	for _, b := range slices.Sorted(maps.Keys(s.sec.bindings)) {
		if contains(s.sec.bindings[b].Policies, name) {
			users = append(users, "identity "+b)
		}
	}
	if len(users) > 0 {
		if len(users) > 5 {
			users = append(users[:5], fmt.Sprintf("and %d more", len(users)-5))
		}
		return Result{Err: fmt.Errorf("%w: policy %q is in use (%s): revoke or unbind those first", ErrInvalid, name, strings.Join(users, ", "))}
	}
	s.bump()
	sec := s.sec.clone()
	delete(sec.policies, name)
	s.sec = sec
	return Result{}
}

func (s *State) aclTokenCreate(c *fsmpb.AclTokenCreate) Result {
	if err := s.sec.checkRefs(c.GetToken().GetPolicies()); err != nil {
		return Result{Err: err}
	}
	sec := s.sec.clone()
	if r := s.addToken(sec, c.GetToken()); r.Err != nil {
		return r
	}
	s.sec = sec
	return Result{}
}

// addToken adds t to sec (a clone about to replace s.sec) and bumps the
// revision.
func (s *State) addToken(sec *Security, t *fsmpb.AclToken) Result {
	switch {
	case ValidateACLName("token id", t.GetId()) != nil:
		return Result{Err: ValidateACLName("token id", t.GetId())}
	case len(t.GetSecretHash()) != sha256.Size:
		return Result{Err: fmt.Errorf("%w: a token's secret hash is %d bytes, not %d", ErrInvalid, len(t.GetSecretHash()), sha256.Size)}
	case len(t.GetDescription()) > maxDescription || !utf8.ValidString(t.GetDescription()):
		return Result{Err: fmt.Errorf("%w: a token's description must be at most %d bytes of UTF-8", ErrInvalid, maxDescription)}
	case sec.tokens[t.GetId()] != nil:
		return Result{Err: fmt.Errorf("%w: token id %q exists", ErrInvalid, t.GetId())}
	case sec.byHash[hex.EncodeToString(t.GetSecretHash())] != nil:
		return Result{Err: fmt.Errorf("%w: a token with this secret exists", ErrInvalid)}
	case len(sec.tokens) >= MaxTokens:
		return Result{Err: fmt.Errorf("%w: tokens: %d, the limit is %d (revoke unused ones: tenure acl token revoke)", ErrLimit, len(sec.tokens), MaxTokens)}
	}
	rev := s.bump()
	tok := &Token{ID: t.GetId(), SecretHash: append([]byte(nil), t.GetSecretHash()...), Policies: append([]string(nil), t.GetPolicies()...), Description: t.GetDescription(), CreateRevision: rev}
	sec.tokens[tok.ID] = tok
	sec.byHash[hex.EncodeToString(tok.SecretHash)] = tok
	return Result{}
}

func (s *State) aclTokenRevoke(c *fsmpb.AclTokenRevoke) Result {
	t := s.sec.tokens[c.GetId()]
	if t == nil {
		return Result{Err: fmt.Errorf("%w: no token %q", ErrInvalid, c.GetId())}
	}
	s.bump()
	sec := s.sec.clone()
	delete(sec.tokens, t.ID)
	delete(sec.byHash, hex.EncodeToString(t.SecretHash))
	s.sec = sec
	return Result{}
}

func (s *State) aclBindingSet(c *fsmpb.AclBindingSet) Result {
	b := c.GetBinding()
	if err := validateIdentityName(b.GetName()); err != nil {
		return Result{Err: err}
	}
	if err := s.sec.checkRefs(b.GetPolicies()); err != nil {
		return Result{Err: err}
	}
	if s.sec.bindings[b.GetName()] == nil && len(s.sec.bindings) >= MaxBindings {
		return Result{Err: fmt.Errorf("%w: identity bindings: %d, the limit is %d", ErrLimit, len(s.sec.bindings), MaxBindings)}
	}
	s.bump()
	sec := s.sec.clone()
	sec.bindings[b.GetName()] = &Binding{Name: b.GetName(), Policies: append([]string(nil), b.GetPolicies()...)}
	s.sec = sec
	return Result{}
}

func (s *State) aclBindingDelete(c *fsmpb.AclBindingDelete) Result {
	if s.sec.bindings[c.GetName()] == nil {
		return Result{Err: fmt.Errorf("%w: no identity %q is bound", ErrInvalid, c.GetName())}
	}
	s.bump()
	sec := s.sec.clone()
	delete(sec.bindings, c.GetName())
	s.sec = sec
	return Result{}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func policyFromProto(p *fsmpb.AclPolicy) (*Policy, error) {
	if err := ValidateACLName("policy name", p.GetName()); err != nil {
		return nil, err
	}
	if n := len(p.GetRules()); n > MaxRulesPerPolicy {
		return nil, fmt.Errorf("%w: a policy has 0..%d rules, not %d", ErrInvalid, MaxRulesPerPolicy, n)
	}
	out := &Policy{Name: p.GetName()}
	for _, r := range p.GetRules() {
		acc, ok := ParseAccess(r.GetAccess())
		if !ok {
			return nil, fmt.Errorf("%w: rule %s:%s:%s: access must be read, write or deny", ErrInvalid, r.GetKind(), r.GetPrefix(), r.GetAccess())
		}
		rule := Rule{Kind: Kind(r.GetKind()), Prefix: r.GetPrefix(), Access: acc}
		if err := validateRule(rule); err != nil {
			return nil, err
		}
		out.Rules = append(out.Rules, rule)
	}
	return out, nil
}

// PolicyToProto converts p for the log, a snapshot or the API.
func PolicyToProto(p *Policy) *fsmpb.AclPolicy {
	out := &fsmpb.AclPolicy{Name: p.Name}
	for _, r := range p.Rules {
		out.Rules = append(out.Rules, &fsmpb.AclRule{Kind: string(r.Kind), Prefix: r.Prefix, Access: r.Access.String()})
	}
	return out
}

// exportSecurity writes sec into a snapshot (nil when empty).
func exportSecurity(sec *Security) *fsmpb.Security {
	if !sec.Bootstrapped && !sec.Enforced && len(sec.policies) == 0 && len(sec.Keys) == 0 {
		return nil
	}
	out := &fsmpb.Security{AclBootstrapped: sec.Bootstrapped, AclEnforced: sec.Enforced, ClusterId: sec.ClusterID}
	for _, p := range sec.Policies() {
		out.Policies = append(out.Policies, PolicyToProto(p))
	}
	for _, t := range sec.Tokens() {
		out.Tokens = append(out.Tokens, &fsmpb.AclToken{Id: t.ID, SecretHash: t.SecretHash, Policies: t.Policies, Description: t.Description, CreateRevision: t.CreateRevision})
	}
	for _, b := range sec.Bindings() {
		out.Bindings = append(out.Bindings, &fsmpb.AclBinding{Name: b.Name, Policies: b.Policies})
	}
	for _, k := range sec.Keys {
		out.SigningKeys = append(out.SigningKeys, &fsmpb.SigningKey{Id: k.ID, Seed: k.Seed, CreateRevision: k.CreateRevision, RetiredRevision: k.RetiredRevision, RetireGraceMs: k.RetireGrace.Milliseconds()})
	}
	return out
}

// importSecurity reads a snapshot's ACLs and keys, checking them as the
// commands that made them would.
func importSecurity(p *fsmpb.Security) (*Security, error) {
	sec := emptySecurity()
	if p == nil {
		return sec, nil
	}
	sec.Bootstrapped = p.GetAclBootstrapped()
	sec.Enforced = p.GetAclEnforced()
	for _, pp := range p.GetPolicies() {
		pol, err := policyFromProto(pp)
		if err != nil {
			return nil, fmt.Errorf("snapshot: policy: %w", err)
		}
		sec.policies[pol.Name] = pol
	}
	for _, t := range p.GetTokens() {
		if err := ValidateACLName("token id", t.GetId()); err != nil || len(t.GetSecretHash()) != sha256.Size {
			return nil, fmt.Errorf("snapshot: token %q is malformed", t.GetId())
		}
		tok := &Token{ID: t.GetId(), SecretHash: t.GetSecretHash(), Policies: t.GetPolicies(), Description: t.GetDescription(), CreateRevision: t.GetCreateRevision()}
		sec.tokens[tok.ID] = tok
		sec.byHash[hex.EncodeToString(tok.SecretHash)] = tok
	}
	for _, b := range p.GetBindings() {
		if err := validateIdentityName(b.GetName()); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		sec.bindings[b.GetName()] = &Binding{Name: b.GetName(), Policies: b.GetPolicies()}
	}
	sec.ClusterID = p.GetClusterId()
	for _, k := range p.GetSigningKeys() {
		if err := validateKey(k); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		if k.GetRetireGraceMs() < 0 || k.GetRetireGraceMs() > MaxRetireGrace.Milliseconds() {
			return nil, fmt.Errorf("%w: snapshot: signing key %s has a retire grace of %d ms", ErrInvalid, k.GetId(), k.GetRetireGraceMs())
		}
		if slices.ContainsFunc(sec.Keys, func(o SigningKey) bool { return o.ID == k.GetId() }) {
			return nil, fmt.Errorf("%w: snapshot: signing key %s appears twice", ErrInvalid, k.GetId())
		}
		sec.Keys = append(sec.Keys, SigningKey{ID: k.GetId(), Seed: k.GetSeed(), CreateRevision: k.GetCreateRevision(), RetiredRevision: k.GetRetiredRevision(), RetireGrace: time.Duration(k.GetRetireGraceMs()) * time.Millisecond})
	}
	if len(sec.Keys) > 0 && len(sec.ClusterID) != ClusterIDBytes {
		return nil, fmt.Errorf("snapshot: signing keys without a cluster id")
	}
	if len(sec.Keys) > MaxSigningKeys {
		return nil, fmt.Errorf("%w: snapshot: %d signing keys, the limit is %d", ErrInvalid, len(sec.Keys), MaxSigningKeys)
	}
	sort.SliceStable(sec.Keys, func(i, j int) bool { return sec.Keys[i].CreateRevision < sec.Keys[j].CreateRevision })
	if k, ok := sec.ActiveKey(); ok && k.RetiredRevision != 0 {
		return nil, fmt.Errorf("%w: snapshot: the newest signing key %s, which signs new grants, is retired", ErrInvalid, k.ID)
	}
	return sec, nil
}

// SessionOwner returns session id's owner text ("" if it does not exist).
func (s *State) SessionOwner(id uint64) string {
	if ss, ok := s.sessions[id]; ok {
		return ss.owner
	}
	return ""
}
