package fsm

// Keys that are not UTF-8 text. etcd's keys are bytes, and the etcd API
// stores them as they come (from cluster version 3). A Go string holds
// any bytes, so the state keeps them as it keeps any key; only the wire
// formats differ: a protobuf string field must be valid UTF-8, so the
// log's commands and the snapshot carry such a key in a bytes field
// beside the string one (key_bin), and Tenure's own API, whose keys are
// text, shows it in its Go-quoted form (ShowKey).

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// ShowKey is how key shows where only text can go (Tenure's API, its CLI
// and dashboard, logs): itself when it is valid UTF-8, else Go-quoted,
// quotes included (strconv.Quote: "\xff\x00k").
func ShowKey(key string) string {
	if utf8.ValidString(key) {
		return key
	}
	return strconv.Quote(key)
}

// KeyFromShown is the key a page's start key (the last key received,
// as ShowKey showed it, then "\x00") stands for: the quoted form of a key
// that is not UTF-8 stands for that key; anything else for itself.
func KeyFromShown(s string) string {
	body, suffix := s, ""
	if b, ok := strings.CutSuffix(s, "\x00"); ok {
		body, suffix = b, "\x00"
	}
	if len(body) >= 2 && body[0] == '"' {
		if k, err := strconv.Unquote(body); err == nil && !utf8.ValidString(k) {
			return k + suffix
		}
	}
	return s
}

// binKey moves a key a string field cannot carry into its bytes field.
func binKey(key *string, bin *[]byte) bool {
	if utf8.ValidString(*key) {
		return false
	}
	*bin, *key = []byte(*key), ""
	return true
}

// fromBin moves a key from its bytes field back into its string field.
func fromBin(key *string, bin *[]byte) {
	if len(*bin) > 0 {
		*key, *bin = string(*bin), nil
	}
}

// kvOps walks the key-value messages of cmd (a batch's commands, a
// transaction's compares and ops, nested ones included), calling each of
// the functions given for them.
func kvOps(cmd *fsmpb.Command, put func(*fsmpb.KVPut), del func(*fsmpb.KVDelete), rng func(*fsmpb.KVRange), cmp func(*fsmpb.KVCompare)) {
	var txn func(t *fsmpb.KVTxn, depth int)
	txn = func(t *fsmpb.KVTxn, depth int) {
		if depth > MaxTxnDepth+1 {
			return // refused by validation
		}
		for _, c := range t.GetCompares() {
			cmp(c)
		}
		for _, branch := range [][]*fsmpb.KVOp{t.GetSuccess(), t.GetFailure()} {
			for _, op := range branch {
				switch o := op.GetOp().(type) {
				case *fsmpb.KVOp_Put:
					put(o.Put)
				case *fsmpb.KVOp_Delete:
					del(o.Delete)
				case *fsmpb.KVOp_Range:
					rng(o.Range)
				case *fsmpb.KVOp_Txn:
					txn(o.Txn, depth+1)
				}
			}
		}
	}
	switch o := cmd.GetOp().(type) {
	case *fsmpb.Command_KvPut:
		put(o.KvPut)
	case *fsmpb.Command_KvDelete:
		del(o.KvDelete)
	case *fsmpb.Command_KvTxn:
		txn(o.KvTxn, 0)
	case *fsmpb.Command_Batch:
		for _, c := range o.Batch.GetCommands() {
			kvOps(c, put, del, rng, cmp)
		}
	}
}

// PackKeys returns cmd ready to encode: cmd itself when every key it
// holds is valid UTF-8, else a copy with those keys in their bytes
// fields (key_bin), which need cluster version 3 (Gates).
func PackKeys(cmd *fsmpb.Command) *fsmpb.Command {
	found := false
	check := func(k string) { found = found || !utf8.ValidString(k) }
	kvOps(cmd, func(p *fsmpb.KVPut) { check(p.GetKey()) }, func(d *fsmpb.KVDelete) { check(d.GetKey()) },
		func(r *fsmpb.KVRange) { check(r.GetKey()); check(r.GetStartKey()) }, func(c *fsmpb.KVCompare) { check(c.GetKey()) })
	if !found {
		return cmd
	}
	out := proto.Clone(cmd).(*fsmpb.Command)
	kvOps(out, func(p *fsmpb.KVPut) { binKey(&p.Key, &p.KeyBin) }, func(d *fsmpb.KVDelete) { binKey(&d.Key, &d.KeyBin) },
		func(r *fsmpb.KVRange) { binKey(&r.Key, &r.KeyBin); binKey(&r.StartKey, &r.StartKeyBin) }, func(c *fsmpb.KVCompare) { binKey(&c.Key, &c.KeyBin) })
	return out
}

// unpackKeys moves the keys of cmd's bytes fields back into their string
// fields, from cluster version 3; below it the fields are ignored, as a
// member of an older release, which does not know them, ignores them.
func (s *State) unpackKeys(cmd *fsmpb.Command) {
	if !s.at(3) {
		return
	}
	kvOps(cmd, func(p *fsmpb.KVPut) { fromBin(&p.Key, &p.KeyBin) }, func(d *fsmpb.KVDelete) { fromBin(&d.Key, &d.KeyBin) },
		func(r *fsmpb.KVRange) { fromBin(&r.Key, &r.KeyBin); fromBin(&r.StartKey, &r.StartKeyBin) }, func(c *fsmpb.KVCompare) { fromBin(&c.Key, &c.KeyBin) })
}

// kvStateRecord is a key's snapshot record, its key in key_bin when it is
// not UTF-8.
func kvStateRecord(kv *KV) *fsmpb.KVState {
	ks := &fsmpb.KVState{Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Session: kv.Session}
	binKey(&ks.Key, &ks.KeyBin)
	return ks
}

// keyOfState is the key of a snapshot record.
func keyOfState(ks *fsmpb.KVState) string {
	if len(ks.GetKeyBin()) > 0 {
		return string(ks.GetKeyBin())
	}
	return ks.GetKey()
}
