package zkcompat

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TTL nodes: both servers run with them on (ZooKeeper with
// -Dzookeeper.extendedTypesEnabled=true, Tenure with --zk-ttl-nodes), and
// check TTL nodes every second.

const (
	opCreateTTL                = 21
	flagPersistentTTL          = 5
	flagPersistentSeqTTL       = 6
	maxTTL               int64 = 1<<40 - 1 // EphemeralType.TTL.maxValue()
)

func createTTLRec(path, data string, flags int32, ttl int64) enc {
	return enc{}.str(path).buf([]byte(data)).acls(openACL).i32(flags).i64(ttl)
}

func createTTLStep(conn int, path, data string, flags int32, ttl int64) step {
	return step{conn, fmt.Sprintf("createTTL %s %q flags=%d ttl=%d", path, data, flags, ttl), opCreateTTL,
		createTTLRec(path, data, flags, ttl),
		func(tr *transcript, d *dec) string { return d.str() + " " + tr.stat(d.stat()) }}
}

func mCreateTTL(path, data string, flags int32, ttl int64) multiOp {
	return multiOp{opCreateTTL, createTTLRec(path, data, flags, ttl)}
}

// seqTTL: createTTL and the TTL create modes, their stats (ephemeralOwner
// 0) and refusals, in a multi too. The TTLs are long: no node expires
// during the sequence.
func seqTTL(r string) []step {
	const long = 600_000
	return []step{
		createStep(0, r, "", flagPersistent),
		createTTLStep(0, r+"/t", "ttl", flagPersistentTTL, long),
		createTTLStep(0, r+"/t", "again", flagPersistentTTL, long),
		createTTLStep(0, r+"/t/s-", "seq", flagPersistentSeqTTL, long),
		createTTLStep(0, r+"/t/s-", "seq", flagPersistentSeqTTL, long),
		createStep(1, r+"/t/eph", "", flagEphemeral),
		getStep(0, r+"/t", false),
		children2Step(0, r+"/t", false),
		createTTLStep(0, r+"/max", "", flagPersistentTTL, maxTTL),
		createTTLStep(0, r+"/over", "", flagPersistentTTL, maxTTL+1),
		createTTLStep(0, r+"/zero", "", flagPersistentTTL, 0),
		createTTLStep(0, r+"/neg", "", flagPersistentSeqTTL, -1),
		createTTLStep(0, r+"/plain", "", flagPersistent, long),
		createTTLStep(0, r+"/eph", "", flagEphemeral, long),
		createTTLStep(0, r+"/none/t", "", flagPersistentTTL, long),
		createStep(0, r+"/c", "", flagPersistentTTL),
		create2Step(0, opCreate2, r+"/c2", "", flagPersistentSeqTTL),
		setStep(0, r+"/t", "set", 0),
		existsStep(0, r+"/t", false),
		multiStep(0, "createTTL", mCreateTTL(r+"/m", "a", flagPersistentTTL, long), mCheck(r+"/m", 0),
			mCreateTTL(r+"/m/s-", "b", flagPersistentSeqTTL, long)),
		multiStep(0, "createTTL with mode persistent", mCreateTTL(r+"/mp", "a", flagPersistent, long)),
		getStep(0, r+"/mp", false),
		multiStep(0, "fails at a TTL of 0", mCreate(r+"/m0", "", flagPersistent), mCreateTTL(r+"/m0/t", "", flagPersistentTTL, 0),
			mCreate(r+"/m1", "", flagPersistent)),
		existsStep(0, r+"/m0", false),
		multiStep(0, "create with a TTL mode", mCreate(r+"/mc", "", flagPersistentTTL)),
		existsStep(0, r+"/mc", false),
		deleteStep(0, r+"/max", 0),
	}
}

func TestDiffTTL(t *testing.T) { differential(t, seqTTL, false) }

// TestZkCliTTL drives zkCli.sh's `create -t`: a TTL node, a sequential
// one, ZooKeeper's stat of them, and the short-lived one removed by the
// server's TTL check while the long-lived one stays; the transcript
// (zxids and times masked) must equal ZooKeeper's.
func TestZkCliTTL(t *testing.T) {
	var want string
	eachTarget(t, func(t *testing.T, s *server, r string) {
		steps := []struct {
			args []string
			code int
			has  []string
		}{
			{[]string{"create", "-t", "600000", r, "hello"}, 0, []string{"Created " + r}},
			{[]string{"create", "-t", "5000", "-s", r + "/s-", "short"}, 0, []string{"Created " + r + "/s-0000000000"}},
			{[]string{"stat", r}, 0, []string{"ephemeralOwner = 0x0", "dataLength = 5", "numChildren = 1", "cversion = 1"}},
			{[]string{"get", r + "/s-0000000000"}, 0, []string{"short"}},
		}
		var transcript []string
		run := func(args []string, code int, has []string) {
			c, out := zkCliRun(t, s, args...)
			transcript = append(transcript, fmt.Sprintf("$ %v -> %d\n%s", args, c, volatile.ReplaceAllString(out, "$1 = *")))
			if c != code {
				t.Fatalf("zkCli %v: exit %d, want %d:\n%s", args, c, code, out)
			}
			for _, h := range has {
				if !containsLine(out, h) {
					t.Errorf("zkCli %v: no line %q in:\n%s", args, h, out)
				}
			}
		}
		for _, st := range steps {
			run(st.args, st.code, st.has)
		}
		// The short-lived node goes within a few checks (of a second each).
		waitFor(t, 30*time.Second, "the TTL node with a TTL of 5s removed", func() bool {
			c, out := zkCliRun(t, s, "stat", r+"/s-0000000000")
			return c == 1 && strings.Contains(out, "Node does not exist")
		})
		run([]string{"stat", r}, 0, []string{"ephemeralOwner = 0x0", "numChildren = 0", "cversion = 2"})
		run([]string{"get", r}, 0, []string{"hello"})
		compareZkCli(t, s, &want, strings.ReplaceAll(strings.Join(transcript, "\n"), r, "ROOT"))
	})
}

// TestCuratorTTL: Curator's create().withTtl() with
// CreateMode.PERSISTENT_WITH_TTL and PERSISTENT_SEQUENTIAL_WITH_TTL, in a
// transaction too; the short-lived node is removed by the server, the
// long-lived one stays.
func TestCuratorTTL(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "ttl") })
}

// TestCuratorPersistentTtlNode: Curator's PersistentTtlNode recipe keeps
// its node alive past several TTLs by touching its TTL child; once the
// recipe is closed, the server removes the child when it expires, then
// the emptied container.
func TestCuratorPersistentTtlNode(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) { runCurator(t, s, root, "persistent-ttl-node") })
}
