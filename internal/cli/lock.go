package cli

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
)

// cleanupTimeout bounds releasing a lock and closing a session once the
// command is over; lostCloseWait bounds closing it after ownership was
// lost (the server may well be out of reach then).
const (
	cleanupTimeout = 5 * time.Second
	lostCloseWait  = 300 * time.Millisecond
)

type lockFlags struct {
	ttl       time.Duration
	timeout   time.Duration
	killGrace time.Duration
	lockDelay time.Duration
	owner     string
	permits   int  // 0: a mutex; >0: a semaphore of that many permits
	shared    bool // a reader of a read-write lock
	election  bool // campaign in the election NAME with value
	value     string
	onSuspect string // "pause" or "stop"
}

// check validates the flags every lock runner shares.
func (lf lockFlags) check() error {
	if lf.timeout < 0 || lf.killGrace < 0 {
		return errors.New("--timeout and --kill-grace must not be negative")
	}
	if lf.onSuspect != "pause" && lf.onSuspect != "stop" {
		return fmt.Errorf("--on-suspect must be pause or stop, not %q", lf.onSuspect)
	}
	return nil
}

// lockArgs checks NAME -- COMMAND [ARG...].
func lockArgs(use, noun string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		dash := cmd.ArgsLenAtDash()
		switch {
		case len(args) == 0:
			return errors.New("usage: " + use)
		case dash < 0:
			return fmt.Errorf("missing '-- COMMAND' after the %s name (usage: %s)", noun, use)
		case dash != 1:
			return fmt.Errorf("want exactly one %s name before '--', got %d", noun, dash)
		case len(args) == dash:
			return errors.New("missing COMMAND after '--'")
		}
		return nil
	}
}

// lockRunFlags adds the flags shared by lock and sem.
func lockRunFlags(cmd *cobra.Command, lf *lockFlags) {
	f := cmd.Flags()
	f.DurationVar(&lf.ttl, "ttl", client.DefaultTTL, "session time to live (1s..1h)")
	f.DurationVar(&lf.timeout, "timeout", 30*time.Second, "give up waiting after this long (0: wait forever); exit 5, or 6 if no node led the cluster")
	f.DurationVar(&lf.killGrace, "kill-grace", 5*time.Second, "after ownership is lost, wait this long between SIGTERM and SIGKILL")
	f.StringVar(&lf.onSuspect, "on-suspect", "pause", "when ownership becomes unproven: pause (SIGSTOP the command, SIGCONT once the hold is confirmed again, stop it if lost) or stop (SIGTERM at once)")
	f.DurationVar(&lf.lockDelay, "lock-delay", 0, "if this grant ends by expiry, keep the name from others this long (0..1m)")
	f.StringVar(&lf.owner, "owner", "", "owner shown in status and history (default hostname:pid)")
}

func (a *app) lockCommand() *cobra.Command {
	var lf lockFlags
	cmd := &cobra.Command{
		Use:   "lock NAME [flags] -- COMMAND [ARG...]",
		Short: "Run a command while holding a lock; inspect locks",
		Long: `Run COMMAND while holding the lock NAME.

tenure lock opens a session (--ttl), waits in FIFO order for the lock
(printing its queue position on stderr), then runs COMMAND with stdin,
stdout and stderr passed through and these variables set:

  TENURE_LOCK         the lock's name
  TENURE_FENCE_TOKEN  the grant's fencing token: pass it with every effect
  TENURE_FENCE_PROOF  the cluster's signature of the grant (one base64url
                      string): pass it with the token to a resource that
                      verifies proofs (tenure fence put --proof, guards)
  TENURE_SESSION      the session id
  TENURE_SESSION_SECRET  the session's secret (hex), which acting as the
                      session needs (e.g. tenure kv put --session): keep
                      it to this command
  TENURE_ENDPOINT     the server address tenure used

When COMMAND exits the lock is released and tenure exits with COMMAND's
status (128+N if signal N killed it). SIGINT and SIGTERM are forwarded to
COMMAND.

If ownership can no longer be proven while COMMAND runs (a renewal is
overdue or the connection broke: the hold is suspect), COMMAND is paused at
once (SIGSTOP): it cannot act while ownership is unproven. When the hold is
confirmed again (the same session and token, e.g. after a fail-over to
another member) it is resumed (SIGCONT). When the hold is lost (the session
expired), COMMAND is sent SIGTERM (and SIGCONT) and SIGKILL after
--kill-grace, and tenure exits 7 saying so. --on-suspect stop stops
COMMAND at the first suspicion instead (also exit 7). Without a terminal, COMMAND runs in
a process group of its own and signals go to the whole group.

tenure exits as soon as COMMAND has. On Linux COMMAND is killed if tenure
itself dies (even by SIGKILL); processes COMMAND started are not (exec the
last one, or trap). On other systems COMMAND runs on without the lock.

Exit codes: COMMAND's status; 5 if --timeout passed while waiting for
the lock (--timeout 0 waits forever); 6 if it passed and no node led the
cluster meanwhile ("no leader"); 7 if the hold was lost and COMMAND was
stopped; 128+N if signal N interrupted the wait; 1 on other errors. -o
does not apply: stdout belongs to COMMAND.

"status", "history" and "list" are subcommands, so they cannot be used
as lock names with this form.`,
		Example: `  tenure lock backup --ttl 10s -- ./backup.sh
  tenure lock status backup -o json
  tenure lock history backup -o json
  tenure lock list --prefix shard- -o json`,
		Args: lockArgs("tenure lock NAME [flags] -- COMMAND [ARG...]", "lock"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runLock(cmd.Context(), args[0], args[1:], lf)
		},
	}
	lockRunFlags(cmd, &lf)
	cmd.AddCommand(a.lockStatusCommand(), a.lockHistoryCommand(), a.lockListCommand())
	return cmd
}

// runLock acquires the lock, runs argv under it and releases it.
func (a *app) runLock(ctx context.Context, name string, argv []string, lf lockFlags) error {
	if err := lf.check(); err != nil {
		return err
	}
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigc)

	owner := lf.owner
	if owner == "" {
		host, _ := os.Hostname()
		owner = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	c, err := a.dial(ctx, client.WithFenceProofs()) // the command gets TENURE_FENCE_PROOF
	if err != nil {
		return err
	}
	defer c.Close()
	sess, h, err := a.acquire(ctx, c, name, owner, lf, sigc)
	if err != nil {
		return err
	}
	// A session cut off from the server must not hold up the exit for
	// long: closing it is a courtesy that frees the lock before its TTL,
	// and after ownership was lost it gets a moment only.
	closeWait := min(cleanupTimeout, lf.ttl)
	defer func() { closeSession(sess, closeWait) }()
	if h.Context().Err() != nil {
		return fmt.Errorf("%w of lock %s (%s) before the command started", errLost, name, h.State())
	}

	env := append(os.Environ(),
		"TENURE_LOCK="+name,
		"TENURE_FENCE_TOKEN="+strconv.FormatUint(h.Token(), 10),
		"TENURE_FENCE_PROOF="+h.Proof(),
		"TENURE_SESSION="+strconv.FormatUint(sess.ID(), 10),
		"TENURE_SESSION_SECRET="+hex.EncodeToString(sess.Secret()),
		"TENURE_ENDPOINT="+a.endpoint,
	)
	ch, err := startChild(argv, env, a.streams)
	if err != nil {
		release(h)
		return err
	}
	waitc := ch.done

	changes := h.Changes()
	cancelled := ctx.Done()
	var (
		reason    string // why the command was stopped; "" while held
		paused    bool   // SIGSTOPped while the hold is suspect (--on-suspect pause)
		killc     <-chan time.Time
		killAt    time.Time
		killTimer *time.Timer
	)
	// armKill schedules SIGKILL after the grace, once.
	armKill := func() {
		if killTimer != nil {
			return
		}
		killAt = time.Now().Add(lf.killGrace)
		killTimer = time.NewTimer(lf.killGrace)
		killc = killTimer.C
	}
	defer func() {
		if killTimer != nil {
			killTimer.Stop()
		}
	}()
	for {
		select {
		case <-waitc:
			if reason != "" {
				ch.reapGroup(killAt)
				closeWait = min(closeWait, lostCloseWait)
				return fmt.Errorf("%w of lock %s (%s): stopped command", errLost, name, reason)
			}
			if err := release(h); err != nil {
				fmt.Fprintln(a.streams.Err, errorLine(fmt.Errorf("releasing lock %s: %w", name, err)))
			}
			if code := exitStatus(ch.cmd.ProcessState); code != 0 {
				return &exitError{code: code}
			}
			return nil
		case st, ok := <-changes:
			if !ok {
				// Closed after the terminal state, or because this
				// loop fell behind (the hold lives on): subscribe again.
				changes = nil
				if st = h.State(); st != client.Lost && st != client.Released {
					changes = h.Changes()
				}
			}
			if reason != "" {
				break
			}
			switch {
			case st == client.Suspect && lf.onSuspect == "pause":
				if !paused {
					ch.signal(syscall.SIGSTOP) // it must not act while ownership is unproven
					paused = true
					fmt.Fprintf(a.streams.Err, "tenure: ownership of lock %s is unproven (suspect): command paused\n", name)
				}
			case st == client.Held:
				if paused {
					ch.signal(syscall.SIGCONT)
					paused = false
					fmt.Fprintf(a.streams.Err, "tenure: lock %s confirmed again (token %d): command resumed\n", name, h.Token())
				}
			default: // suspect with --on-suspect stop, lost, released
				reason = st.String()
				ch.stop() // SIGTERM, and SIGCONT if it was paused
				armKill()
			}
		case <-killc:
			killc = nil
			ch.signal(syscall.SIGKILL)
		case s := <-sigc:
			ch.signal(signalNumber(s))
		case <-cancelled:
			// Run's context ended (in-process use): stop like on loss of
			// ownership, but report the command's status.
			cancelled = nil
			ch.stop()
			armKill()
		}
	}
}

// acquire opens a session and waits for the lock, within --timeout and
// until SIGINT/SIGTERM.
func (a *app) acquire(ctx context.Context, c *client.Client, name, owner string, lf lockFlags, sigc <-chan os.Signal) (*client.Session, *client.Hold, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if lf.timeout > 0 {
		var cancelTimeout context.CancelFunc
		wctx, cancelTimeout = context.WithTimeout(wctx, lf.timeout)
		defer cancelTimeout()
	}
	type result struct {
		s   *client.Session
		h   *client.Hold
		err error
	}
	rc := make(chan result, 1)
	go func() {
		s, err := c.NewSession(wctx, client.WithTTL(lf.ttl), client.WithOwner(owner))
		if err != nil {
			rc <- result{err: err}
			return
		}
		opts := []client.MutexOption{client.WithLockDelay(lf.lockDelay)}
		if lf.permits > 0 {
			opts = append(opts, client.WithPermits(lf.permits))
		}
		m, err := s.Mutex(name, opts...)
		if err == nil {
			var h *client.Hold
			lock := m.Lock
			if lf.shared {
				lock = m.RLock
			}
			if lf.election {
				e, eerr := s.Election(name)
				if eerr != nil {
					closeSession(s, cleanupTimeout)
					rc <- result{err: eerr}
					return
				}
				lock = func(ctx context.Context, opts ...client.LockOption) (*client.Hold, error) {
					return e.Campaign(ctx, []byte(lf.value), opts...)
				}
			}
			h, err = lock(wctx, client.OnQueued(func(pos int) {
				fmt.Fprintf(a.streams.Err, "tenure: waiting for lock %s (position %d)\n", name, pos)
			}))
			if err == nil {
				rc <- result{s: s, h: h}
				return
			}
		}
		closeSession(s, cleanupTimeout)
		rc <- result{err: err}
	}()
	var sig os.Signal
	for {
		select {
		case s := <-sigc:
			if sig == nil {
				sig = s
				cancel()
			}
		case r := <-rc:
			switch {
			case sig != nil:
				if r.err == nil {
					release(r.h)
					closeSession(r.s, cleanupTimeout)
				}
				return nil, nil, &exitError{code: 128 + int(signalNumber(sig)), err: fmt.Errorf("interrupted by %s while waiting for lock %s", sigName(sig), name)}
			case r.err == nil:
				return r.s, r.h, nil
			case errors.Is(r.err, client.ErrNoLeader):
				// Not contention: nothing could be granted at all.
				return nil, nil, fmt.Errorf("no leader: waited %v for lock %s, and no node led the cluster meanwhile (is a majority of its members up?): %w", lf.timeout, name, r.err)
			case errors.Is(wctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
				return nil, nil, fmt.Errorf("timed out after %v waiting for lock %s: %w", lf.timeout, name, context.DeadlineExceeded)
			}
			return nil, nil, a.describe(r.err)
		}
	}
}

// release gives the hold back under a fresh, bounded context.
func release(h *client.Hold) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	return h.Unlock(ctx)
}

// closeSession ends the session under a fresh context bounded by timeout.
func closeSession(s *client.Session, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = s.Close(ctx)
}

// holderJSON is a lock's current holder.
type holderJSON struct {
	Owner   string `json:"owner"`
	Session uint64 `json:"session"`
	Token   uint64 `json:"token"`
}

// modeHolderJSON is one holder of a lock, with how it holds it.
type modeHolderJSON struct {
	Owner   string `json:"owner"`
	Session uint64 `json:"session"`
	Token   uint64 `json:"token"`
	// Mode is "exclusive" (a mutex, a writer, an election's leader),
	// "shared" (a reader) or "permit" (one permit of a semaphore).
	Mode string `json:"mode"`
}

// holderMode is how h holds a lock of permits.
func holderMode(h *pb.Holder, permits uint32) string {
	switch {
	case h.GetShared():
		return "shared"
	case permits > 1:
		return "permit"
	}
	return "exclusive"
}

func modeHolders(hs []*pb.Holder, permits uint32) []modeHolderJSON {
	out := make([]modeHolderJSON, 0, len(hs))
	for _, h := range hs {
		out = append(out, modeHolderJSON{Owner: h.GetOwner(), Session: h.GetSession(), Token: h.GetToken(), Mode: holderMode(h, permits)})
	}
	return out
}

// waiterJSON is a queued request.
type waiterJSON struct {
	Owner          string `json:"owner"`
	Session        uint64 `json:"session"`
	QueuedRevision uint64 `json:"queued_revision"`
}

// lockStatusJSON is `tenure lock status -o json`.
type lockStatusJSON struct {
	Name string `json:"name"`
	// Holder is the first holder (kept for scripts that read it);
	// Holders lists every one.
	Holder      *holderJSON      `json:"holder"`
	Holders     []modeHolderJSON `json:"holders"`
	Waiters     int              `json:"waiters"`
	WaiterOrder []waiterJSON     `json:"waiter_order"`
	Delayed     bool             `json:"delayed"`
	Revision    uint64           `json:"revision"`
}

func (a *app) lockStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status NAME",
		Short: "Show a lock's holders and waiters",
		Long: `Show a lock's holders (every reader of a read-write lock, every permit of a
semaphore), each with its mode, and its waiters.

JSON: {"name","holder":{"owner","session","token"}|null,
"holders":[{"owner","session","token","mode"}],"waiters":N,
"waiter_order":[{"owner","session","queued_revision"}],"delayed","revision"}.
holder is the first holder; mode is "exclusive", "shared" (a reader) or
"permit" (a semaphore's). holders and waiter_order are in grant order:
the first waiter is granted next. The server lists holders and waiters in
pages, read one after the other: "revision" is the first page's.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.listing(cmd, func(ctx context.Context, c *client.Client) error {
				st, err := c.LockStatus(ctx, args[0])
				if err != nil {
					return err
				}
				out := lockStatusJSON{Name: st.GetName(), Holders: modeHolders(st.GetHolders(), st.GetPermits()), Waiters: len(st.GetWaiters()), WaiterOrder: []waiterJSON{}, Delayed: st.GetDelayed(), Revision: st.GetRevision()}
				if h := st.GetHolder(); h != nil {
					out.Holder = &holderJSON{Owner: h.GetOwner(), Session: h.GetSession(), Token: h.GetToken()}
				}
				for _, w := range st.GetWaiters() {
					out.WaiterOrder = append(out.WaiterOrder, waiterJSON{Owner: w.GetOwner(), Session: w.GetSession(), QueuedRevision: w.GetQueuedRevision()})
				}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "lock %s\n", out.Name)
					if len(out.Holders) == 0 {
						fmt.Fprintln(w, "holder:  none")
					}
					for _, h := range out.Holders {
						fmt.Fprintf(w, "holder:  %s (session %d, token %d, %s)\n", h.Owner, h.Session, h.Token, h.Mode)
					}
					if out.Delayed {
						fmt.Fprintln(w, "delayed: yes (lock-delay after an expiry)")
					}
					fmt.Fprintf(w, "waiters: %d\n", out.Waiters)
					for i, wt := range out.WaiterOrder {
						fmt.Fprintf(w, "  %d. %s (session %d)\n", i+1, wt.Owner, wt.Session)
					}
				})
			})
		},
	}
}

// lockSummaryJSON is one lock of `tenure lock list -o json`.
type lockSummaryJSON struct {
	Name    string           `json:"name"`
	Kind    string           `json:"kind"`
	Holders []modeHolderJSON `json:"holders"`
	Waiters uint32           `json:"waiters"`
	DelayMs int64            `json:"delay_ms"`
}

// lockListJSON is `tenure lock list -o json`.
type lockListJSON struct {
	Locks []lockSummaryJSON `json:"locks"`
	// Next is the name to list after (--after) for the locks left out by
	// --limit; null when none were.
	Next *string `json:"next"`
}

func (a *app) lockListCommand() *cobra.Command {
	var prefix, after string
	var limit int
	cmd := &cobra.Command{
		Use:   "list [--prefix P] [--limit N] [--after NAME]",
		Short: "List the locks, by name",
		Long: `List the locks (mutexes, semaphores, read-write locks and elections) whose
names start with --prefix, by name: kind, every holder with its mode, how
many wait, and the lock-delay holding the lock back.

kind is "mutex", "semaphore", "rwlock" (while a reader holds or waits:
held by a writer alone, a read-write lock lists as a mutex) or
"election"; a holder's mode is "exclusive", "shared" or "permit".
delay_ms is 0 unless a lock-delay holds the lock back. With --limit, at
most N locks are listed and "next" names the last of them when more
follow: list again with --after it. The server answers in pages, read one
after the other: with more locks than one page holds, the list is not one
snapshot.

JSON: {"locks":[{"name","kind","holders":[{"owner","session","token",
"mode"}],"waiters":N,"delay_ms":N}],"next":NAME|null}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return fmt.Errorf("--limit must not be negative, not %d", limit)
			}
			return a.listing(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.LocksFrom(ctx, prefix, after, limit)
				if err != nil {
					return err
				}
				out := lockListJSON{Locks: make([]lockSummaryJSON, 0, len(resp.GetLocks()))}
				for _, l := range resp.GetLocks() {
					holders := l.GetFirstHolders()
					if int(l.GetHolders()) > len(holders) { // more than a listing names
						st, err := c.LockStatus(ctx, l.GetName())
						if err != nil {
							return err
						}
						holders = st.GetHolders()
					}
					out.Locks = append(out.Locks, lockSummaryJSON{Name: l.GetName(), Kind: l.GetKind(), Holders: modeHolders(holders, l.GetPermits()), Waiters: l.GetWaiters(), DelayMs: l.GetDelayMs()})
				}
				if resp.GetMore() && len(out.Locks) > 0 {
					next := out.Locks[len(out.Locks)-1].Name
					out.Next = &next
				}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "%d locks\n", len(out.Locks))
					for _, l := range out.Locks {
						var hs []string
						for _, h := range l.Holders {
							hs = append(hs, fmt.Sprintf("%s (session %d, token %d, %s)", h.Owner, h.Session, h.Token, h.Mode))
						}
						held := "free"
						if len(hs) > 0 {
							held = "held by " + strings.Join(hs, ", ")
						}
						delay := ""
						if l.DelayMs > 0 {
							delay = fmt.Sprintf("  lock-delay %dms", l.DelayMs)
						}
						fmt.Fprintf(w, "  %s  %s  %s  %d waiting%s\n", l.Name, l.Kind, held, l.Waiters, delay)
					}
					if out.Next != nil {
						fmt.Fprintf(w, "more after %s (--after %q)\n", *out.Next, *out.Next)
					}
				})
			})
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "only the locks whose names start with this")
	cmd.Flags().StringVar(&after, "after", "", "only the locks whose names come after this one (the \"next\" of a listing)")
	cmd.Flags().IntVar(&limit, "limit", 0, "list at most this many locks (0: all)")
	return cmd
}

// grantJSON is one grant in a lock's history.
type grantJSON struct {
	Owner           string `json:"owner"`
	Session         uint64 `json:"session"`
	Token           uint64 `json:"token"`
	Ended           string `json:"ended"`
	GrantedRevision uint64 `json:"granted_revision"`
	EndedRevision   uint64 `json:"ended_revision"`
}

// lockHistoryJSON is `tenure lock history -o json`.
type lockHistoryJSON struct {
	Name   string      `json:"name"`
	Grants []grantJSON `json:"grants"`
}

func (a *app) lockHistoryCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "history NAME",
		Short: "Show a lock's recent grants, oldest first",
		Long: `Show a lock's recent grants, oldest first (the server keeps a bounded number).

JSON: {"name","grants":[{"owner","session","token","ended","granted_revision",
"ended_revision"}]} where ended is "released", "expired" or "held".`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				hist, err := c.LockHistory(ctx, args[0])
				if err != nil {
					return err
				}
				out := lockHistoryJSON{Name: hist.GetName(), Grants: []grantJSON{}}
				for _, g := range hist.GetGrants() {
					out.Grants = append(out.Grants, grantJSON{Owner: g.GetOwner(), Session: g.GetSession(), Token: g.GetToken(), Ended: g.GetEnded(), GrantedRevision: g.GetGrantedRevision(), EndedRevision: g.GetEndedRevision()})
				}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "lock %s: %d grants\n", out.Name, len(out.Grants))
					for _, g := range out.Grants {
						fmt.Fprintf(w, "  token %d  %-8s  %s (session %d)\n", g.Token, g.Ended, g.Owner, g.Session)
					}
				})
			})
		},
	}
}

// sigName names the signals tenure lock reacts to.
func sigName(s os.Signal) string {
	switch signalNumber(s) {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}
