package epoch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
)

// Writer writes one epoch: the directory named after its token. It is
// safe for concurrent use.
//
// The Writer does not look at the hold's state: a check before a write
// cannot close the race with a pause after it, and writes of a stale owner
// are harmless here because nobody reads its directory. Pass the hold's
// Context to stop early; Publish is where staleness is decided.
//
// Finish every write before calling Publish: a Commit running
// concurrently with Publish may land after the epoch became visible.
type Writer struct {
	d     *Dirs
	epoch Epoch

	// mu guards the fields below.
	mu        sync.Mutex
	published bool
	// maybePublished: an earlier Publish failed without a verdict, so
	// the epoch may have been published.
	maybePublished bool
}

// WriterOption configures Dirs.Writer.
type WriterOption func(*writerOptions)

type writerOptions struct{ proof string }

// WithProof gives the grant's fence proof (client.Hold.Proof), which Dirs
// made WithVerifier require.
func WithProof(proof string) WriterOption {
	return func(o *writerOptions) { o.proof = proof }
}

// Writer creates (if needed) the epoch directory for token and returns its
// writer. If the published epoch is already above token it returns an
// error matching client.ErrStale and creates nothing: a newer owner exists.
// That early answer saves work; it does not replace Publish's check. With
// a verifier (WithVerifier), a token without a proof that verifies is
// ErrForged, and nothing is created or read.
func (d *Dirs) Writer(ctx context.Context, token uint64, opts ...WriterOption) (*Writer, error) {
	if token == 0 {
		return nil, errors.New("epoch: token must be positive")
	}
	var o writerOptions
	for _, opt := range opts {
		opt(&o)
	}
	if d.verifier != nil {
		if err := d.verifier.Verify(d.lock, token, o.proof); err != nil {
			return nil, fmt.Errorf("%w: token %d for lock %q: %s", ErrForged, token, d.lock, strings.TrimPrefix(err.Error(), fenceproof.ErrForged.Error()+": "))
		}
	}
	pub, err := d.Published(ctx)
	switch {
	case errors.Is(err, ErrNotPublished):
	case err != nil:
		return nil, err
	case pub.Token > token:
		return nil, fmt.Errorf("%w: epoch %d is published; token %d is older", client.ErrStale, pub.Token, token)
	}
	e := d.Epoch(token)
	if err := os.MkdirAll(d.root, 0o755); err != nil {
		return nil, fmt.Errorf("epoch: %w", err)
	}
	if err := os.Mkdir(e.Dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("epoch: %w", err)
	}
	if err := syncDir(d.root); err != nil {
		return nil, err
	}
	return &Writer{d: d, epoch: e, published: pub.Token == token}, nil
}

// Epoch is the writer's epoch.
func (w *Writer) Epoch() Epoch { return w.epoch }

// Dir is the writer's epoch directory.
func (w *Writer) Dir() string { return w.epoch.Dir }

// Token is the writer's token.
func (w *Writer) Token() uint64 { return w.epoch.Token }

// WriteFile writes data to rel inside the epoch (creating parent
// directories), durably: temporary file, fsync, rename, fsync of the
// parent. It fails with ErrPublished after Publish, with an error
// matching client.ErrStale if the epoch directory was collected, and
// with ctx's error if ctx has ended before it starts.
func (w *Writer) WriteFile(ctx context.Context, rel string, data []byte) error {
	f, err := w.Create(ctx, rel)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Abort()
		return err
	}
	return f.Commit()
}

// Create starts writing rel inside the epoch. The file appears under its
// name only when Commit succeeds; Abort (or a crash) leaves at most a
// temporary file in the unpublished epoch.
func (w *Writer) Create(ctx context.Context, rel string) (*File, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := checkRel(rel); err != nil {
		return nil, err
	}
	if err := w.writable(); err != nil {
		return nil, err
	}
	full := filepath.Join(w.epoch.Dir, rel)
	parent := filepath.Dir(full)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("epoch: %w", err)
	}
	tmp, err := os.CreateTemp(parent, ".tmp-"+filepath.Base(full)+"-")
	if err != nil {
		return nil, fmt.Errorf("epoch: %w", err)
	}
	return &File{w: w, f: tmp, name: full}, nil
}

// writable checks that the epoch may still be written.
func (w *Writer) writable() error {
	w.mu.Lock()
	published := w.published
	w.mu.Unlock()
	if published {
		return fmt.Errorf("%w: %s", ErrPublished, w.epoch.Dir)
	}
	if _, err := os.Stat(w.epoch.Dir); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: epoch directory %s was removed (collected after a newer epoch was published)", client.ErrStale, w.epoch.Dir)
	} else if err != nil {
		return fmt.Errorf("epoch: %w", err)
	}
	return nil
}

// Publish makes the writer's epoch the one readers see: it fsyncs the
// epoch directory and the root, then writes the epoch to the pointer
// register with the writer's token. If the pointer holds a newer epoch it
// returns an error matching client.ErrStale and changes nothing: stop, a
// newer owner exists. Publishing the same epoch again is accepted. On
// client.ErrUnknownOutcome, retry Publish.
func (w *Writer) Publish(ctx context.Context) error {
	if _, err := os.Stat(w.epoch.Dir); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: epoch directory %s was removed (collected after a newer epoch was published)", client.ErrStale, w.epoch.Dir)
	}
	if err := syncTree(w.epoch.Dir); err != nil {
		return err
	}
	// The marker is durable before the pointer can move (see Collect).
	marker := w.d.marker(w.epoch.Token)
	if err := writeSynced(marker); err != nil {
		return err
	}
	if err := syncDir(w.d.root); err != nil {
		return err
	}
	v := []byte(strconv.FormatUint(w.epoch.Token, 10))
	if _, err := w.d.regs.FencedPut(ctx, w.d.pointer, v, w.epoch.Token, ""); err != nil {
		w.mu.Lock()
		if !errors.Is(err, client.ErrStale) {
			w.maybePublished = true // the outcome may be unknown
		} else if !w.maybePublished {
			// Never published, and never will be.
			os.Remove(marker)
		}
		w.mu.Unlock()
		return fmt.Errorf("epoch: publishing epoch %d to %q: %w", w.epoch.Token, w.d.pointer, err)
	}
	w.mu.Lock()
	w.published = true
	w.mu.Unlock()
	return nil
}

// writeSynced creates an empty file (or keeps an existing one) and fsyncs it.
func writeSynced(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("epoch: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("epoch: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("epoch: %w", err)
	}
	return nil
}

// syncTree fsyncs dir and every directory below it. Files were fsynced
// when they were committed; their directory entries are made durable here.
func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("epoch: %w", err)
		}
		if !e.IsDir() {
			return nil
		}
		return syncDir(path)
	})
}

// File is a file being written into an epoch. It is not safe for
// concurrent use.
type File struct {
	w    *Writer
	f    *os.File
	name string
	done bool
}

var _ io.Writer = (*File)(nil)

// Write appends to the file.
func (f *File) Write(p []byte) (int, error) { return f.f.Write(p) }

// Commit fsyncs the file and renames it to its name in the epoch. It fails
// with ErrPublished if the epoch was published meanwhile.
func (f *File) Commit() error {
	if f.done {
		return errors.New("epoch: file already committed or aborted")
	}
	f.done = true
	tmp := f.f.Name()
	if err := f.f.Sync(); err != nil {
		f.f.Close()
		os.Remove(tmp)
		return fmt.Errorf("epoch: %w", err)
	}
	if err := f.f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("epoch: %w", err)
	}
	if err := f.w.writable(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, f.name); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("epoch: %w", err)
	}
	return syncDir(filepath.Dir(f.name))
}

// Abort discards the file. It is a no-op after Commit.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.f.Close()
	os.Remove(f.f.Name())
}
