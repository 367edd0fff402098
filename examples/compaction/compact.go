package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tenure-io/tenure/guard/epoch"
)

// Record is one key and its value.
type Record struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

func (r Record) validate() error {
	if r.Key == "" || strings.ContainsAny(r.Key, "\t\n\r") || strings.ContainsAny(r.Value, "\n\r") {
		return fmt.Errorf("record %q=%q: the key must be non-empty without tabs or line breaks, the value without line breaks", r.Key, r.Value)
	}
	return nil
}

// Config is one compaction run.
type Config struct {
	// Dir is the root of the epoch directories.
	Dir string
	// Pointer is the Tenure register holding the published epoch.
	Pointer string
	// Token is the fencing token of the lock grant this run works under.
	Token uint64
	// Puts are the new records to merge in; they stand for the fresh data
	// a real compactor reads from its write-ahead log. Later puts of a key
	// win.
	Puts []Record
	// SegmentRecords is the number of records per output segment.
	SegmentRecords int
	// Keep is how many epochs below the published one to keep after a
	// successful publish; negative disables collection.
	Keep int
	// beforePublish, if set, runs after the segments are written and
	// before the epoch is published (tests use it to stall the worker).
	beforePublish func()
}

// Result describes a finished run.
type Result struct {
	Result     string   `json:"result"`
	Epoch      uint64   `json:"epoch"`
	InputEpoch uint64   `json:"input_epoch"`
	Records    int      `json:"records"`
	Segments   []string `json:"segments"`
	Collected  []uint64 `json:"collected"`
}

// segmentPattern matches segment files; manifest lists them in order.
const (
	segmentGlob = "seg-*.kv"
	manifest    = "MANIFEST"
)

// Compact reads the published epoch, merges cfg.Puts into it, writes the
// result as segments into the epoch of cfg.Token and publishes that
// epoch. A newer owner makes it fail with an error matching
// client.ErrStale: then nothing it wrote is visible to readers.
func Compact(ctx context.Context, regs epoch.Registers, cfg Config) (Result, error) {
	if cfg.SegmentRecords <= 0 {
		return Result{}, errors.New("records per segment must be positive")
	}
	for _, r := range cfg.Puts {
		if err := r.validate(); err != nil {
			return Result{}, err
		}
	}
	d, err := epoch.New(regs, cfg.Dir, cfg.Pointer)
	if err != nil {
		return Result{}, err
	}
	// Create our epoch first: it fails early with ErrStale if a newer
	// epoch is already published.
	w, err := d.Writer(ctx, cfg.Token)
	if err != nil {
		return Result{}, err
	}
	res := Result{Epoch: cfg.Token, Segments: []string{}, Collected: []uint64{}}
	in, inEpoch, err := readPublished(ctx, d)
	if err != nil {
		return res, err
	}
	res.InputEpoch = inEpoch

	merged := make(map[string]string, len(in)+len(cfg.Puts))
	for _, r := range in {
		merged[r.Key] = r.Value
	}
	for _, r := range cfg.Puts {
		merged[r.Key] = r.Value
	}
	keys := make([]string, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	res.Records = len(keys)

	for i := 0; i < len(keys); i += cfg.SegmentRecords {
		var buf bytes.Buffer
		for _, k := range keys[i:min(i+cfg.SegmentRecords, len(keys))] {
			fmt.Fprintf(&buf, "%s\t%s\n", k, merged[k])
		}
		name := fmt.Sprintf("seg-%06d.kv", len(res.Segments)+1)
		if err := w.WriteFile(ctx, name, buf.Bytes()); err != nil {
			return res, err
		}
		res.Segments = append(res.Segments, name)
	}
	if err := w.WriteFile(ctx, manifest, []byte(strings.Join(res.Segments, "\n")+"\n")); err != nil {
		return res, err
	}
	if cfg.beforePublish != nil {
		cfg.beforePublish()
	}
	if err := w.Publish(ctx); err != nil {
		return res, err
	}
	res.Result = "published"
	if cfg.Keep >= 0 {
		removed, err := d.Collect(ctx, cfg.Keep)
		if err != nil {
			return res, fmt.Errorf("published, but collecting old epochs failed: %w", err)
		}
		for _, e := range removed {
			res.Collected = append(res.Collected, e.Token)
		}
	}
	return res, nil
}

// Read returns the records of the published epoch and its token (0 and no
// records if nothing is published yet).
func Read(ctx context.Context, regs epoch.Registers, dir, pointer string) ([]Record, uint64, error) {
	d, err := epoch.New(regs, dir, pointer)
	if err != nil {
		return nil, 0, err
	}
	return readPublished(ctx, d)
}

func readPublished(ctx context.Context, d *epoch.Dirs) ([]Record, uint64, error) {
	m, e, err := d.ReadFile(ctx, manifest)
	if errors.Is(err, epoch.ErrNotPublished) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var out []Record
	for _, name := range strings.Fields(string(m)) {
		if ok, _ := filepath.Match(segmentGlob, name); !ok {
			return nil, 0, fmt.Errorf("epoch %d: manifest lists %q, not a segment", e.Token, name)
		}
		recs, err := readSegment(filepath.Join(e.Dir, name))
		if err != nil {
			return nil, 0, fmt.Errorf("epoch %d: %w", e.Token, err)
		}
		out = append(out, recs...)
	}
	return out, e.Token, nil
}

func readSegment(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "\t")
		if !ok {
			return nil, fmt.Errorf("%s: malformed line %q", path, sc.Text())
		}
		out = append(out, Record{Key: k, Value: v})
	}
	return out, sc.Err()
}
