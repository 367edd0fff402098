// Package epoch fences writes to files and object stores that cannot check
// a token themselves, by putting the token in the name.
//
// A writer that holds a lock with fencing token T writes only under
// <root>/epoch-<T, zero-padded to 20 digits>/, a directory no one else
// writes, and when its content is complete publishes T as the current
// epoch in a Tenure fenced register (the pointer). Readers ask the pointer
// for the current epoch and read only that directory. The pointer is a
// fenced register: a publish with a token lower than the one it holds is
// answered stale, so the pointer only moves forward. An old owner that
// wakes up after a pause can still write, but only into its own epoch
// directory, which nobody reads, and its publish is rejected.
//
//	root/
//	  epoch-00000000000000000041/   A's epoch: A paused here; never published
//	  epoch-00000000000000000042/   B's epoch: published, what readers see
//
// # Contract
//
//   - Write every file of an epoch, then Publish. Files are written to a
//     temporary name, fsynced and renamed; Publish fsyncs the epoch
//     directory and the root before it moves the pointer, so a published
//     epoch's files survive a crash of the writer's machine.
//   - A published epoch is immutable: the Writer refuses writes after a
//     successful Publish (ErrPublished). New content needs a new grant, and
//     so a new token and a new epoch.
//   - Publish with the same token again is accepted (a retry after
//     client.ErrUnknownOutcome is safe); a lower token than the pointer's is
//     answered with an error matching client.ErrStale: stop, a newer owner
//     exists.
//   - A reader resolves the pointer (a linearizable read) and then reads
//     files; if the pointer moves meanwhile it finishes reading the epoch
//     it resolved, which stays complete until it is collected.
//
// # Garbage collection
//
// Collect removes epoch directories whose token is below the published
// one. It is safe only for those: the pointer never moves back, so an
// epoch below it is never published again. It never touches the published
// epoch or anything above it (a newer owner may be writing an epoch it has
// not published yet). Epochs below the pointer that were never published
// (a stale owner's) are removed at once; of those that were published
// earlier, the newest keep are kept, because a reader that resolved one
// just before a newer publish may still be reading it. Keep at least one,
// or collect only after the readers' longest read. An old owner still
// writing into a collected directory gets errors matching client.ErrStale.
//
// Publish records that an epoch is being published in a marker file next
// to its directory (<root>/epoch-<T>.published), written before the pointer
// moves and removed again if the publish is rejected; Collect uses it to
// tell earlier published epochs from never-published ones. A marker left
// by a crash during Publish only makes Collect keep more.
//
// # Object stores
//
// The same layout works on an object store with prefixes instead of
// directories (s3://bucket/shard-7/epoch-00000000000000000042/seg-1). Where
// the store offers conditional writes, use them as well:
//
//   - Create-only objects per epoch (S3 PutObject with If-None-Match: *;
//     GCS x-goog-if-generation-match: 0): a second writer with the same
//     token, or a retry, cannot overwrite a segment already written.
//   - If the pointer must live in the object store instead of Tenure, store
//     it as an object whose body is the epoch and replace it only by
//     compare-and-swap: read it with its ETag (S3) or generation (GCS),
//     check that the stored epoch is at most your token, and write with
//     If-Match: <etag> (S3) or x-goog-if-generation-match: <generation>
//     (GCS). A 412 Precondition Failed means someone else wrote in between:
//     re-read and re-check; if the stored epoch is above your token you are
//     stale. The check "stored epoch <= token" and the conditional write
//     together are the fenced compare-and-advance; the condition alone only
//     detects concurrency, it does not order owners.
//   - GCS object generations grow with every write of a name and can serve
//     as the pointer's version, but they are the store's numbers, not your
//     lock's tokens: compare tokens in the body, use generations only for
//     the condition.
//
// A Tenure register as the pointer is simpler: the token check and the
// write are one operation on the server (Publish).
package epoch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
)

// Prefix starts every epoch directory's name.
const Prefix = "epoch-"

// digits is the zero-padded width of the token in a directory name: every
// uint64 fits, and names sort in token order.
const digits = 20

// Sentinel errors.
var (
	// ErrNotPublished: no epoch has been published under the pointer yet.
	ErrNotPublished = errors.New("epoch: no epoch published")
	// ErrPublished: the Writer's epoch is already published and therefore
	// immutable; nothing was written.
	ErrPublished = errors.New("epoch: epoch already published; published epochs are immutable")
	// ErrForged: Dirs has a verifier (WithVerifier) and the token came
	// without a fence proof that verifies for the epochs' lock: no
	// directory was created. It also matches fenceproof.ErrForged.
	ErrForged = fmt.Errorf("epoch: %w", fenceproof.ErrForged)
)

// Name is the directory name of the epoch with token t.
func Name(t uint64) string {
	return fmt.Sprintf("%s%0*d", Prefix, digits, t)
}

// ParseName returns the token of an epoch directory name.
func ParseName(name string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, Prefix)
	if !ok || len(s) != digits {
		return 0, false
	}
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil || t == 0 {
		return 0, false
	}
	return t, true
}

// Registers is the part of *client.Client this package uses.
type Registers interface {
	FencedPut(ctx context.Context, key string, value []byte, token uint64, operationID string, opts ...client.FenceOption) (client.PutResult, error)
	FencedGet(ctx context.Context, key string) (client.Register, error)
}

// Epoch is one epoch: its token and its directory.
type Epoch struct {
	Token uint64
	Dir   string
}

// Dirs is a root directory of epochs and the register that points at the
// published one. It is safe for concurrent use.
type Dirs struct {
	regs    Registers
	root    string
	pointer string
	// verifier and lock: see WithVerifier (nil: proofs are not checked).
	verifier *fenceproof.Verifier
	lock     string
}

// Option configures New.
type Option func(*Dirs) error

// WithVerifier makes Writer accept a token only with a fence proof
// (WithProof) that v verifies for a grant of lock, the Tenure lock whose
// holders write these epochs: any other token is ErrForged before a
// directory is created, with no round trip to Tenure. Build v from the
// cluster's public keys (fenceproof.ParseKeyset), and keep it fresh
// (Verifier.Refresh) so that keys the cluster retires stop verifying here.
func WithVerifier(v *fenceproof.Verifier, lock string) Option {
	return func(d *Dirs) error {
		if v == nil || lock == "" {
			return errors.New("epoch: WithVerifier needs a verifier and the lock's name")
		}
		d.verifier, d.lock = v, lock
		return nil
	}
}

// New returns the epochs under root whose published epoch is kept in the
// Tenure register named pointer. It does not touch the disk or the server.
func New(regs Registers, root, pointer string, opts ...Option) (*Dirs, error) {
	switch {
	case regs == nil:
		return nil, errors.New("epoch: nil Registers")
	case root == "":
		return nil, errors.New("epoch: empty root directory")
	case pointer == "":
		return nil, errors.New("epoch: empty pointer register key")
	}
	d := &Dirs{regs: regs, root: filepath.Clean(root), pointer: pointer}
	for _, o := range opts {
		if err := o(d); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Root is the directory holding the epoch directories.
func (d *Dirs) Root() string { return d.root }

// Pointer is the register key of the published epoch.
func (d *Dirs) Pointer() string { return d.pointer }

// Epoch returns the epoch with token t (it may not exist).
func (d *Dirs) Epoch(t uint64) Epoch {
	return Epoch{Token: t, Dir: filepath.Join(d.root, Name(t))}
}

// Published returns the published epoch, or an error matching
// ErrNotPublished if there is none. The read is linearizable.
func (d *Dirs) Published(ctx context.Context) (Epoch, error) {
	reg, err := d.regs.FencedGet(ctx, d.pointer)
	if err != nil {
		return Epoch{}, fmt.Errorf("epoch: reading pointer %q: %w", d.pointer, err)
	}
	if !reg.Found {
		return Epoch{}, fmt.Errorf("%w under pointer %q", ErrNotPublished, d.pointer)
	}
	t, err := strconv.ParseUint(string(reg.Value), 10, 64)
	if err != nil || t != reg.Token {
		return Epoch{}, fmt.Errorf("epoch: pointer %q holds %q under token %d: not written by this package", d.pointer, reg.Value, reg.Token)
	}
	return d.Epoch(t), nil
}

// ReadFile reads rel from the published epoch.
func (d *Dirs) ReadFile(ctx context.Context, rel string) ([]byte, Epoch, error) {
	if err := checkRel(rel); err != nil {
		return nil, Epoch{}, err
	}
	e, err := d.Published(ctx)
	if err != nil {
		return nil, Epoch{}, err
	}
	b, err := os.ReadFile(filepath.Join(e.Dir, rel))
	return b, e, err
}

// Epochs lists the epochs present on disk, in token order.
func (d *Dirs) Epochs() ([]Epoch, error) {
	ents, err := os.ReadDir(d.root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("epoch: listing %s: %w", d.root, err)
	}
	var out []Epoch
	for _, e := range ents {
		if t, ok := ParseName(e.Name()); ok && e.IsDir() {
			out = append(out, d.Epoch(t))
		}
	}
	slices.SortFunc(out, func(a, b Epoch) int {
		switch {
		case a.Token < b.Token:
			return -1
		case a.Token > b.Token:
			return 1
		}
		return 0
	})
	return out, nil
}

// Collect removes the epoch directories below the published epoch except
// the newest keep of those that were published earlier, and returns what
// it removed, in token order. See the package doc for when this is safe.
// With nothing published it removes nothing.
func (d *Dirs) Collect(ctx context.Context, keep int) ([]Epoch, error) {
	if keep < 0 {
		return nil, errors.New("epoch: negative keep")
	}
	pub, err := d.Published(ctx)
	if errors.Is(err, ErrNotPublished) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	all, err := d.Epochs()
	if err != nil {
		return nil, err
	}
	var victims []Epoch
	kept := 0
	for _, e := range slices.Backward(all) {
		if e.Token >= pub.Token {
			continue
		}
		if kept < keep && d.wasPublished(e.Token) {
			kept++
			continue
		}
		victims = append(victims, e)
	}
	slices.Reverse(victims)
	var removed []Epoch
	for _, e := range victims {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		if err := os.RemoveAll(e.Dir); err != nil {
			return removed, fmt.Errorf("epoch: removing %s: %w", e.Dir, err)
		}
		if err := os.Remove(d.marker(e.Token)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("epoch: %w", err)
		}
		removed = append(removed, e)
	}
	if len(removed) == 0 {
		return nil, nil
	}
	return removed, syncDir(d.root)
}

// marker is the file that records that epoch t was (being) published.
func (d *Dirs) marker(t uint64) string {
	return filepath.Join(d.root, Name(t)+".published")
}

func (d *Dirs) wasPublished(t uint64) bool {
	_, err := os.Stat(d.marker(t))
	return err == nil
}

func checkRel(rel string) error {
	if rel == "" || !filepath.IsLocal(rel) {
		return fmt.Errorf("epoch: %q is not a relative path inside the epoch", rel)
	}
	return nil
}

// syncDir fsyncs a directory so that entries created or removed in it are
// durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("epoch: syncing %s: %w", dir, err)
	}
	return nil
}
