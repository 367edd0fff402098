package zkapi

import (
	"fmt"
	"strings"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
)

// ZooKeeper's four-letter words: a connection whose first four bytes are
// one of them gets a line of text and is closed. As in ZooKeeper 3.8,
// only some are answered (its 4lw.commands.whitelist); the others get
// ZooKeeper's refusal, and so does srvr under --auth.
var fourLetterWords = map[string]bool{
	"conf": false, "cons": false, "crst": false, "dirs": false, "dump": false, "envi": false, "gtmk": false,
	"hash": false, "isro": true, "mntr": false, "ruok": true, "srst": false, "srvr": true, "stat": false,
	"stmk": false, "wchc": false, "wchp": false, "wchs": false,
}

func isFourLetterWord(b []byte) bool {
	_, ok := fourLetterWords[string(b)]
	return ok
}

// ServerVersion is the ZooKeeper version srvr reports: the wire format's.
const ServerVersion = "3.8.0-tenure"

func (c *conn) fourLetterWord(cmd string) {
	var out string
	switch {
	case !fourLetterWords[cmd] || (cmd == "srvr" && c.z.srv.AuthEnforced()):
		// Under --auth, srvr (the zxid, the znode count, the
		// connections) is refused as a word off the whitelist: a
		// four-letter word carries no credential. ruok and isro stay,
		// as /health does on the HTTP listener.
		out = cmd + " is not executed because it is not in the whitelist.\n"
	case cmd == "ruok":
		out = "imok"
	case cmd == "isro":
		out = "rw"
	case cmd == "srvr":
		mode := "follower"
		if c.z.front.IsLeader() {
			mode = "leader"
		}
		var rev uint64
		var nodes int
		c.z.front.Read(func(st *fsm.State) { rev, nodes = st.Revision(), st.ZnodeCount() })
		c.z.mu.Lock()
		conns := len(c.z.conns)
		c.z.mu.Unlock()
		var b strings.Builder
		fmt.Fprintf(&b, "Zookeeper version: %s, built on %s\n", ServerVersion, "tenure")
		fmt.Fprintf(&b, "Latency min/avg/max: 0/0.0/0\nReceived: 0\nSent: 0\nConnections: %d\nOutstanding: 0\n", conns)
		fmt.Fprintf(&b, "Zxid: 0x%x\nMode: %s\nNode count: %d\n", rev, mode, nodes)
		out = b.String()
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.nc.Write([]byte(out))
}
