package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// ErrCompacted: a watch needs changes older than the server's event
// history. The error is a *CompactedError with the revisions needed to
// recover: re-read the keys (Get/Range), then watch from the read's
// Revision + 1.
var ErrCompacted = errors.New("tenure: watch history compacted")

// CompactedError is the ErrCompacted a watch ends with.
type CompactedError struct {
	// CompactRevision: the server keeps only changes after this revision.
	CompactRevision uint64
	// CurrentRevision: the server's revision when it answered.
	CurrentRevision uint64
	msg             string
}

func (e *CompactedError) Error() string { return e.msg }

// Unwrap makes errors.Is(err, ErrCompacted) hold.
func (e *CompactedError) Unwrap() error { return ErrCompacted }

// compactedFrom turns a watch's OUT_OF_RANGE status into a CompactedError.
func compactedFrom(err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.OutOfRange {
		return nil
	}
	ce := &CompactedError{msg: st.Message()}
	for _, d := range st.Details() {
		if c, ok := d.(*pb.KVCompacted); ok {
			ce.CompactRevision, ce.CurrentRevision = c.GetCompactRevision(), c.GetCurrentRevision()
		}
	}
	return ce
}

// KeyValue is a key with its metadata.
type KeyValue struct {
	Key   string
	Value []byte
	// CreateRevision is the revision of the put that created the key.
	CreateRevision uint64
	// ModRevision is the revision of its last change.
	ModRevision uint64
	// Version counts the puts since the key was created (1 for a new key).
	Version uint64
	// Session is the session an ephemeral key is bound to (0: none).
	Session uint64
}

func kvFromProto(kv *pb.KVKeyValue) KeyValue {
	return KeyValue{Key: kv.GetKey(), Value: kv.GetValue(), CreateRevision: kv.GetCreateRevision(), ModRevision: kv.GetModRevision(), Version: kv.GetVersion(), Session: kv.GetSession()}
}

func kvsFromProto(kvs []*pb.KVKeyValue) []KeyValue {
	out := make([]KeyValue, len(kvs))
	for i, kv := range kvs {
		out[i] = kvFromProto(kv)
	}
	return out
}

// PutOption configures a put.
type PutOption func(*pb.KVPutRequest)

// WithSession makes the key ephemeral: the server deletes it when the
// session ends (closed or expired). A put naming a session that has
// already ended fails with ErrSessionExpired. A later put without this
// option makes the key persistent again.
func WithSession(s *Session) PutOption {
	return WithSessionCredentials(s.ID(), s.Secret())
}

// WithSessionCredentials is WithSession for a session known by its id and
// secret (for example one opened by another process, which passed both:
// see Session.Secret). A wrong secret is refused with ErrPermissionDenied.
func WithSessionCredentials(id uint64, secret []byte) PutOption {
	return func(r *pb.KVPutRequest) { r.Session, r.SessionSecret = id, secret }
}

// Put writes key and returns the revision of the write.
//
// With several endpoints a put whose node stops answering is retried on
// the next one, so it may be applied twice (the value is the same; the
// version counts both). Use Txn with a compare for exactly-once effects.
func (c *Client) Put(ctx context.Context, key string, value []byte, opts ...PutOption) (uint64, error) {
	req := &pb.KVPutRequest{Key: key, Value: value}
	for _, o := range opts {
		o(req)
	}
	var resp *pb.KVPutResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.KVPut(ctx, req)
		return err
	})
	if err != nil {
		return 0, err
	}
	return resp.GetRevision(), nil
}

// RangeResult is the answer of Get and Range.
type RangeResult struct {
	// KVs in key order.
	KVs []KeyValue
	// More: the limit cut the answer short.
	More bool
	// Revision is the service's revision the read reflects: for a Range
	// of several pages, the first page's (see Range).
	Revision uint64
}

func (c *Client) rangeReq(ctx context.Context, req *pb.KVRangeRequest) (RangeResult, error) {
	req.Serializable = c.serializable
	var resp *pb.KVRangeResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.KVRange(ctx, req)
		return err
	})
	if err != nil {
		return RangeResult{}, err
	}
	return RangeResult{KVs: kvsFromProto(resp.GetKvs()), More: resp.GetMore(), Revision: resp.GetRevision()}, nil
}

// Get reads one key (linearizable unless WithSerializableReads); the
// result's KVs is empty when the key does not exist.
func (c *Client) Get(ctx context.Context, key string) (RangeResult, error) {
	return c.rangeReq(ctx, &pb.KVRangeRequest{Key: key})
}

// Range reads every key starting with prefix ("" is every key), in key
// order, at most limit of them when limit > 0 (More then says whether
// keys were left out).
//
// The server answers in pages (at most 10,000 keys and 2 MiB each), which
// Range follows until it has limit keys or the last one. Each page is a
// read of its own: a Range of more than one page is not one snapshot.
// Revision is the first page's: a key that did not change during the call
// is as it was at Revision, and a Watch from Revision + 1 misses no change
// (it may repeat some that later pages already reflect).
func (c *Client) Range(ctx context.Context, prefix string, limit int64) (RangeResult, error) {
	return c.RangeFrom(ctx, prefix, "", limit)
}

// RangeFrom is Range starting at the key start (inclusive). To page
// through a prefix with a limit, pass the last key received + "\x00"
// while More; each call is a read of its own, at its own revision.
func (c *Client) RangeFrom(ctx context.Context, prefix, start string, limit int64) (RangeResult, error) {
	var out RangeResult
	for first := true; ; first = false {
		req := &pb.KVRangeRequest{Key: prefix, Prefix: true, StartKey: start}
		if limit > 0 {
			req.Limit = limit - int64(len(out.KVs))
		}
		page, err := c.rangeReq(ctx, req)
		if err != nil {
			return RangeResult{}, err
		}
		if first {
			out.Revision = page.Revision
		}
		out.KVs = append(out.KVs, page.KVs...)
		out.More = page.More
		if !page.More || (limit > 0 && int64(len(out.KVs)) >= limit) {
			return out, nil
		}
		if len(page.KVs) == 0 {
			return RangeResult{}, errEmptyPage
		}
		start = page.KVs[len(page.KVs)-1].Key + "\x00"
	}
}

// DeleteResult is the answer of Delete and DeletePrefix.
type DeleteResult struct {
	Deleted int64
	// Revision is the service's revision after the call (unchanged when
	// nothing was deleted).
	Revision uint64
}

func (c *Client) del(ctx context.Context, req *pb.KVDeleteRequest) (DeleteResult, error) {
	var resp *pb.KVDeleteResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.KVDelete(ctx, req)
		return err
	})
	if err != nil {
		return DeleteResult{}, err
	}
	return DeleteResult{Deleted: resp.GetDeleted(), Revision: resp.GetRevision()}, nil
}

// Delete deletes key.
func (c *Client) Delete(ctx context.Context, key string) (DeleteResult, error) {
	return c.del(ctx, &pb.KVDeleteRequest{Key: key})
}

// DeletePrefix deletes every key starting with prefix, at one revision.
func (c *Client) DeletePrefix(ctx context.Context, prefix string) (DeleteResult, error) {
	return c.del(ctx, &pb.KVDeleteRequest{Key: prefix, Prefix: true})
}

// CompareOp is the relation a Compare tests.
type CompareOp int32

// The relations; Greater and Less compare bytes for values, numbers else.
const (
	Equal    CompareOp = CompareOp(pb.KVCompareResult_KV_COMPARE_RESULT_EQUAL)
	NotEqual CompareOp = CompareOp(pb.KVCompareResult_KV_COMPARE_RESULT_NOT_EQUAL)
	Greater  CompareOp = CompareOp(pb.KVCompareResult_KV_COMPARE_RESULT_GREATER)
	Less     CompareOp = CompareOp(pb.KVCompareResult_KV_COMPARE_RESULT_LESS)
)

// Compare is one condition of a transaction.
type Compare struct{ c *pb.KVCompare }

func cmpOf(key string, t pb.KVCompareTarget, op CompareOp) Compare {
	return Compare{&pb.KVCompare{Key: key, Target: t, Result: pb.KVCompareResult(op)}}
}

// ValueIs holds when key's value op value; never for a missing key.
func ValueIs(key string, op CompareOp, value []byte) Compare {
	c := cmpOf(key, pb.KVCompareTarget_KV_COMPARE_TARGET_VALUE, op)
	c.c.Value = value
	return c
}

// VersionIs compares key's version (0 for a missing key).
func VersionIs(key string, op CompareOp, v uint64) Compare {
	c := cmpOf(key, pb.KVCompareTarget_KV_COMPARE_TARGET_VERSION, op)
	c.c.Number = v
	return c
}

// CreateRevisionIs compares key's create revision (0 for a missing key).
func CreateRevisionIs(key string, op CompareOp, rev uint64) Compare {
	c := cmpOf(key, pb.KVCompareTarget_KV_COMPARE_TARGET_CREATE_REVISION, op)
	c.c.Number = rev
	return c
}

// ModRevisionIs compares key's mod revision (0 for a missing key).
func ModRevisionIs(key string, op CompareOp, rev uint64) Compare {
	c := cmpOf(key, pb.KVCompareTarget_KV_COMPARE_TARGET_MOD_REVISION, op)
	c.c.Number = rev
	return c
}

// KeyExists holds when key exists (its version is above 0).
func KeyExists(key string) Compare { return VersionIs(key, Greater, 0) }

// KeyMissing holds when key does not exist (its version is 0).
func KeyMissing(key string) Compare { return VersionIs(key, Equal, 0) }

// Op is one operation of a transaction.
type Op struct{ op *pb.KVRequestOp }

// OpPut writes key.
func OpPut(key string, value []byte, opts ...PutOption) Op {
	r := &pb.KVPutRequest{Key: key, Value: value}
	for _, o := range opts {
		o(r)
	}
	return Op{&pb.KVRequestOp{Op: &pb.KVRequestOp_Put{Put: r}}}
}

// OpGet reads key.
func OpGet(key string) Op {
	return Op{&pb.KVRequestOp{Op: &pb.KVRequestOp_Range{Range: &pb.KVRangeRequest{Key: key}}}}
}

// OpRange reads the keys under prefix (at most limit when limit > 0).
// Like one page of Range it answers at most 10,000 keys or 2 MiB, with
// OpResult.More set when keys were left out (read on with RangeFrom); and
// a transaction whose ranges could answer more than the server's
// --max-response-bytes is refused (RESOURCE_EXHAUSTED, nothing written),
// so give it a limit when the prefix may hold many keys.
func OpRange(prefix string, limit int64) Op {
	return Op{&pb.KVRequestOp{Op: &pb.KVRequestOp_Range{Range: &pb.KVRangeRequest{Key: prefix, Prefix: true, Limit: limit}}}}
}

// OpDelete deletes key.
func OpDelete(key string) Op {
	return Op{&pb.KVRequestOp{Op: &pb.KVRequestOp_Delete{Delete: &pb.KVDeleteRequest{Key: key}}}}
}

// OpDeletePrefix deletes the keys under prefix.
func OpDeletePrefix(prefix string) Op {
	return Op{&pb.KVRequestOp{Op: &pb.KVRequestOp_Delete{Delete: &pb.KVDeleteRequest{Key: prefix, Prefix: true}}}}
}

// TxnResult is the answer of Txn.
type TxnResult struct {
	// Succeeded: every compare held, so the then-ops ran (else the else-ops).
	Succeeded bool
	// Revision is the service's revision after the transaction; all its
	// writes carry this one revision.
	Revision uint64
	// Results has one entry per op of the branch taken.
	Results []OpResult
}

// OpResult is the result of one op of a transaction.
type OpResult struct {
	// KVs of a get or range (it sees the writes before it in the branch).
	KVs []KeyValue
	// More: the range answered one page, or its limit, and left keys out.
	More bool
	// Deleted counts the keys a delete removed.
	Deleted int64
}

// Txn applies then if every compare in ifs holds, else els: atomically,
// linearizably, at one revision.
func (c *Client) Txn(ctx context.Context, ifs []Compare, then, els []Op) (TxnResult, error) {
	req := &pb.KVTxnRequest{}
	for _, x := range ifs {
		req.Compare = append(req.Compare, x.c)
	}
	for _, o := range then {
		req.Success = append(req.Success, o.op)
	}
	for _, o := range els {
		req.Failure = append(req.Failure, o.op)
	}
	var resp *pb.KVTxnResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.KVTxn(ctx, req)
		return err
	})
	if err != nil {
		return TxnResult{}, err
	}
	out := TxnResult{Succeeded: resp.GetSucceeded(), Revision: resp.GetRevision()}
	for _, r := range resp.GetResponses() {
		var or OpResult
		switch x := r.GetOp().(type) {
		case *pb.KVResponseOp_Range:
			or.KVs, or.More = kvsFromProto(x.Range.GetKvs()), x.Range.GetMore()
		case *pb.KVResponseOp_Delete:
			or.Deleted = x.Delete.GetDeleted()
		}
		out.Results = append(out.Results, or)
	}
	return out, nil
}

// EventType says what a watch event reports.
type EventType int

// Event types.
const (
	EventPut    EventType = 1
	EventDelete EventType = 2
)

// String is "put" or "delete".
func (t EventType) String() string {
	if t == EventDelete {
		return "delete"
	}
	return "put"
}

// Event is one change of one key; KV.ModRevision is its revision. A
// delete's KV holds only the key and that revision.
type Event struct {
	Type EventType
	KV   KeyValue
}

// WatchResponse is a batch of events, in revision order, or a progress
// notification (Progress, no events).
type WatchResponse struct {
	Events []Event
	// Revision: every matching change up to this revision has been
	// delivered. A watch resumed from Revision + 1 misses nothing.
	Revision uint64
	// Progress: a notification on an idle watch that the revision moved.
	Progress bool
}

// WatchOption configures Watch.
type WatchOption func(*pb.KVWatchRequest) error

// WithPrefix watches every key starting with the watched key.
func WithPrefix() WatchOption {
	return func(r *pb.KVWatchRequest) error {
		r.Prefix = true
		return nil
	}
}

// WithStartRevision starts the watch at rev (inclusive) instead of after
// the current revision: every change from rev on is delivered.
func WithStartRevision(rev uint64) WatchOption {
	return func(r *pb.KVWatchRequest) error {
		if rev == 0 {
			return fmt.Errorf("%w: start revision 0 (omit the option to watch from now)", ErrInvalid)
		}
		r.StartRevision = rev
		return nil
	}
}

// Watcher is a running watch.
type Watcher struct {
	// C receives every change in revision order, and progress
	// notifications. It is closed when the watch ends; Err then says why.
	C   <-chan WatchResponse
	err error
	end chan struct{}
}

// Err is why the watch ended: ctx.Err() when cancelled, ErrClosed when the
// client was closed, a *CompactedError (ErrCompacted) when the server no
// longer has the changes it needs, or another error. Call it after C is
// closed; it blocks until then.
func (w *Watcher) Err() error {
	<-w.end
	return w.err
}

// Watch follows key (or, WithPrefix, every key under it). It returns once
// the server has accepted the watch. When the connection breaks or the
// node stops serving, the watch reconnects by itself (to the next
// endpoint) and resumes from the revision after the last one delivered,
// so no change is missed or repeated; it ends only when ctx ends or with
// an error that retrying cannot fix (see Err).
func (c *Client) Watch(ctx context.Context, key string, opts ...WatchOption) (*Watcher, error) {
	req := &pb.KVWatchRequest{Key: key}
	for _, o := range opts {
		if err := o(req); err != nil {
			return nil, err
		}
	}
	stream, created, err := c.openWatch(ctx, req, false)
	if err != nil {
		return nil, err
	}
	ch := make(chan WatchResponse, 64)
	w := &Watcher{C: ch, end: make(chan struct{})}
	go func() {
		defer close(w.end)
		defer close(ch)
		w.err = c.watchLoop(ctx, req, stream, created.GetRevision(), ch)
	}()
	return w, nil
}

// openWatch starts req on the leader or, if it cannot serve, another
// endpoint (Client.rotate; persist: also while a single endpoint cannot be
// reached), and returns the stream and its first answer. Each node keeps
// its own history (a node restarted from a snapshot has less): a
// compacted answer sends the watch to the next endpoint, and counts as the
// answer only once every endpoint has given it.
func (c *Client) openWatch(ctx context.Context, req *pb.KVWatchRequest, persist bool) (pb.Tenure_KVWatchClient, *pb.KVWatchResponse, error) {
	var stream pb.Tenure_KVWatchClient
	var created *pb.KVWatchResponse
	compacted := 0
	err := c.rotate(ctx, persist, func(i uint32) error {
		st, err := c.all()[i].api.KVWatch(ctx, req)
		var first *pb.KVWatchResponse
		if err == nil {
			first, err = st.Recv()
		}
		switch ce := compactedFrom(err); {
		case err == nil && first.GetCreated():
			stream, created = st, first
			return nil
		case err == nil:
			return fmt.Errorf("%w: the watch was answered %v before it was created", ErrUnavailable, first)
		case ce != nil:
			if compacted++; compacted < len(c.all()) {
				return fmt.Errorf("%w: %v", ErrUnavailable, ce) // another node may hold more history
			}
			return ce
		case errors.Is(err, io.EOF):
			return fmt.Errorf("%w: the server ended the watch", ErrUnavailable)
		case status.Code(err) == codes.Canceled && ctx.Err() == nil:
			return fmt.Errorf("%w: the client was closed (%v)", ErrClosed, err)
		}
		return fromStatus(err)
	})
	return stream, created, err
}

func (c *Client) watchLoop(ctx context.Context, req *pb.KVWatchRequest, stream pb.Tenure_KVWatchClient, last uint64, ch chan<- WatchResponse) error {
	for {
		resp, err := stream.Recv()
		if err == nil {
			if resp.GetCreated() {
				continue
			}
			wr := WatchResponse{Revision: resp.GetRevision(), Progress: resp.GetProgress()}
			for _, e := range resp.GetEvents() {
				if e.GetKv().GetModRevision() <= last {
					continue // already delivered before a reconnect
				}
				wr.Events = append(wr.Events, Event{Type: EventType(e.GetType()), KV: kvFromProto(e.GetKv())})
			}
			last = max(last, resp.GetRevision())
			if len(wr.Events) == 0 && !wr.Progress {
				continue
			}
			select {
			case ch <- wr:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ce := compactedFrom(err); ce != nil {
			return ce
		}
		if status.Code(err) == codes.Canceled {
			return fmt.Errorf("%w: the client was closed (%v)", ErrClosed, err)
		}
		if !errors.Is(err, io.EOF) && !unavailable(err) {
			return fromStatus(err)
		}
		// Reconnect, moving through the endpoints, and resume after last.
		next := &pb.KVWatchRequest{Key: req.GetKey(), Prefix: req.GetPrefix(), StartRevision: last + 1}
		if stream, _, err = c.openWatch(ctx, next, true); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
}
