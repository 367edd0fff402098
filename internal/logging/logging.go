// Package logging builds the server's structured logger (log/slog, text or
// JSON) and routes the logs of the libraries it runs through it: raft's
// hclog (Raft) and code that writes plain lines (Writer).
package logging

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// Formats lists the values New accepts for format.
var Formats = []string{"text", "json"}

// ParseLevel reads a level name: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q (want debug, info, warn or error)", s)
}

// New returns a logger that writes records to w as text (key=value) or
// JSON lines, from level on.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	lv, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("unknown log format %q (want text or json)", format)
}

// Writer returns a writer that logs every line written to it as one record
// of level, the line as its message (a leading "tenure: " dropped).
func Writer(l *slog.Logger, level slog.Level) io.Writer { return lineWriter{l, level} }

type lineWriter struct {
	l     *slog.Logger
	level slog.Level
}

func (w lineWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		if msg := strings.TrimPrefix(string(line), "tenure: "); msg != "" {
			w.l.Log(context.Background(), w.level, msg)
		}
	}
	return len(p), nil
}

// Raft returns an hclog.Logger, for raft and its transport and snapshot
// store, that logs through l with the attribute component=raft (and
// name=... for a named logger). raft's messages below warn (elections
// starting, pipelines, snapshots) are logged only when l logs debug; so
// are the messages listed in routine, whatever their level (what raft
// warns of that is expected here, e.g. a single node's first election).
func Raft(l *slog.Logger, routine ...string) hclog.Logger {
	min := hclog.Warn
	if l.Enabled(context.Background(), slog.LevelDebug) {
		min = hclog.Trace
	}
	base := l.With("component", "raft")
	h := &hcLogger{base: base, l: base, level: new(atomic.Int32), routine: routine}
	h.level.Store(int32(min))
	return h
}

// hcLogger is hclog.Logger over slog.
type hcLogger struct {
	base  *slog.Logger // with the implied arguments, without the name
	l     *slog.Logger // base with the name
	name  string
	args  []any
	level *atomic.Int32 // hclog.Level, shared by the loggers derived from one
	// routine messages are logged at debug.
	routine []string
}

func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Info, hclog.NoLevel, hclog.DefaultLevel:
		return slog.LevelInfo
	case hclog.Warn:
		return slog.LevelWarn
	}
	return slog.LevelError
}

func (h *hcLogger) enabled(level hclog.Level) bool {
	return level >= hclog.Level(h.level.Load()) && h.l.Enabled(context.Background(), slogLevel(level))
}

func (h *hcLogger) Log(level hclog.Level, msg string, args ...any) {
	if level > hclog.Debug && slices.Contains(h.routine, msg) {
		level = hclog.Debug
	}
	if !h.enabled(level) {
		return
	}
	h.l.Log(context.Background(), slogLevel(level), msg, args...)
}

func (h *hcLogger) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hcLogger) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hcLogger) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hcLogger) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hcLogger) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }
func (h *hcLogger) IsTrace() bool                 { return h.enabled(hclog.Trace) }
func (h *hcLogger) IsDebug() bool                 { return h.enabled(hclog.Debug) }
func (h *hcLogger) IsInfo() bool                  { return h.enabled(hclog.Info) }
func (h *hcLogger) IsWarn() bool                  { return h.enabled(hclog.Warn) }
func (h *hcLogger) IsError() bool                 { return h.enabled(hclog.Error) }
func (h *hcLogger) ImpliedArgs() []any            { return h.args }
func (h *hcLogger) Name() string                  { return h.name }
func (h *hcLogger) SetLevel(level hclog.Level)    { h.level.Store(int32(level)) }
func (h *hcLogger) GetLevel() hclog.Level         { return hclog.Level(h.level.Load()) }

func (h *hcLogger) With(args ...any) hclog.Logger {
	base := h.base.With(args...)
	return (&hcLogger{base: base, args: append(append([]any(nil), h.args...), args...), level: h.level, routine: h.routine}).named(h.name)
}

func (h *hcLogger) named(name string) *hcLogger {
	h.name, h.l = name, h.base
	if name != "" {
		h.l = h.base.With("name", name)
	}
	return h
}

func (h *hcLogger) Named(name string) hclog.Logger {
	if h.name != "" {
		name = h.name + "." + name
	}
	return h.ResetNamed(name)
}

func (h *hcLogger) ResetNamed(name string) hclog.Logger {
	return (&hcLogger{base: h.base, args: h.args, level: h.level, routine: h.routine}).named(name)
}

func (h *hcLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hcLogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return Writer(h.l, slog.LevelWarn)
}
