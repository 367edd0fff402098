package etcdcompat

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The differential test of etcd's JSON gateway: the same HTTP requests,
// as curl and etcd's HTTP clients send them, to etcd 3.7.3 and to
// Tenure's etcd port; the answers (status, and the JSON body) must be
// equal modulo what differs between any two servers: the header's ids
// and term, revisions (compared as the number of key changes up to
// them, as the gRPC differential test does: Tenure's revision also
// counts lease grants), lease ids (by the order they were granted in)
// and a lease's remaining TTL.

// gwStep is one request of the workload.
type gwStep struct {
	method, path, body string
	// write: the request changes keys (its header's revision is a key
	// change when it is new).
	write bool
	// stream: the answer is a stream of JSON objects, of which the first
	// is compared.
	stream bool
	// codeOnly: compare the status and the error's code, not its message
	// (protobuf's JSON decoding errors vary their text by build).
	codeOnly bool
	// fields: compare only these top-level fields (nil: all).
	fields []string
}

func b64s(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// j writes a JSON body, with 'k(x)' standing for the base64 of x.
func j(s string) string {
	for {
		i := strings.Index(s, "k(")
		if i < 0 {
			return s
		}
		e := strings.Index(s[i:], ")")
		s = s[:i] + `"` + b64s(s[i+2:i+e]) + `"` + s[i+e+1:]
	}
}

func gwWorkload() []gwStep {
	post := func(path, body string) gwStep { return gwStep{method: http.MethodPost, path: path, body: j(body)} }
	write := func(path, body string) gwStep {
		s := post(path, body)
		s.write = true
		return s
	}
	return []gwStep{
		// etcd reports the storage version of a new data directory (3.5.0)
		// until it has upgraded it, a few seconds after it starts; Tenure
		// reports the settled value.
		{method: http.MethodGet, path: "/version", fields: []string{"etcdserver", "etcdcluster"}},
		{method: http.MethodGet, path: "/health"},
		{method: http.MethodGet, path: "/health?serializable=true"},
		{method: http.MethodPost, path: "/health"},
		{method: http.MethodGet, path: "/nothing"},
		// Keys.
		write("/v3/kv/put", `{"key":k(a),"value":k(1)}`),
		write("/v3/kv/put", `{"key":k(a),"value":k(2),"prev_kv":true}`),
		write("/v3/kv/put", `{"key":k(b/1),"value":k(x)}`),
		write("/v3beta/kv/put", `{"key":k(b/2),"value":k(y)}`),
		write("/v3/kv/put", `{"key":k(b/3),"value":k(),"prev_kv":true}`),
		post("/v3/kv/range", `{"key":k(a)}`),
		post("/v3/kv/range", `{"key":k(missing)}`),
		post("/v3/kv/range", `{"key":k(b/),"range_end":k(b0)}`),
		post("/v3beta/kv/range", `{"key":k(b/),"range_end":k(b0),"limit":"2","sort_order":"DESCEND","sort_target":"VALUE"}`),
		post("/v3/kv/range", `{"key":k(b/),"range_end":k(b0),"keys_only":true}`),
		post("/v3/kv/range", `{"key":k(b/),"range_end":k(b0),"count_only":true}`),
		post("/v3/kv/range", `{"key":"AA==","range_end":"AA=="}`),
		post("/v3/kv/range", `{"key":k(b/),"range_end":k(b0),"serializable":true,"min_mod_revision":"1"}`),
		write("/v3/kv/put", `{"key":k(a),"ignore_value":true}`),
		post("/v3/kv/range", `{"key":k(a)}`),
		// Transactions.
		write("/v3/kv/txn", `{"compare":[{"key":k(a),"target":"VALUE","result":"EQUAL","value":k(2)}],`+
			`"success":[{"request_put":{"key":k(t),"value":k(yes)}},{"request_range":{"key":k(a)}}],`+
			`"failure":[{"request_put":{"key":k(t),"value":k(no)}}]}`),
		write("/v3/kv/txn", `{"compare":[{"key":k(a),"target":"CREATE","result":"EQUAL","create_revision":"0"}],`+
			`"success":[{"request_put":{"key":k(a),"value":k(taken)}}],`+
			`"failure":[{"request_range":{"key":k(a)}},{"request_delete_range":{"key":k(t),"prev_kv":true}}]}`),
		write("/v3/kv/txn", `{"compare":[{"key":k(b/),"range_end":k(b0),"target":"VERSION","result":"GREATER","version":"0"}],`+
			`"success":[{"request_range":{"key":k(b/),"range_end":k(b0),"count_only":true}}]}`),
		// Deletes.
		write("/v3/kv/deleterange", `{"key":k(b/3),"prev_kv":true}`),
		write("/v3/kv/deleterange", `{"key":k(none)}`),
		post("/v3/kv/range", `{"key":k(b/),"range_end":k(b0)}`),
		// Leases.
		post("/v3/lease/grant", `{"TTL":"60"}`),
		post("/v3/lease/grant", `{"TTL":"120","ID":"0"}`),
		write("/v3/kv/put", `{"key":k(l/1),"value":k(v),"lease":"L1"}`),
		write("/v3/kv/put", `{"key":k(l/2),"value":k(v),"lease":"L1"}`),
		post("/v3/lease/timetolive", `{"ID":"L1","keys":true}`),
		post("/v3/kv/lease/timetolive", `{"ID":"L2"}`),
		{method: http.MethodPost, path: "/v3/lease/keepalive", body: `{"ID":"L1"}`, stream: true},
		{method: http.MethodPost, path: "/v3/lease/keepalive", body: `{"ID":"L2"}`, stream: true},
		post("/v3/lease/leases", `{}`),
		write("/v3/lease/revoke", `{"ID":"L1"}`),
		post("/v3/kv/range", `{"key":k(l/),"range_end":k(l0)}`),
		post("/v3/kv/lease/revoke", `{"ID":"L2"}`),
		post("/v3/lease/timetolive", `{"ID":"L1"}`),
		{method: http.MethodPost, path: "/v3/lease/keepalive", body: `{"ID":"L1"}`, stream: true},
		post("/v3/lease/leases", `{}`),
		// Errors.
		post("/v3/kv/put", `{"value":k(v)}`),
		post("/v3/kv/range", `{}`),
		post("/v3/lease/revoke", `{"ID":"123456"}`),
		write("/v3/kv/put", `{"key":k(a),"value":k(v),"lease":"123456"}`),
		post("/v3/kv/put", `{"key":k(a),"ignore_lease":true,"lease":"1"}`),
		post("/v3/kv/txn", `{"success":[{"request_put":{"key":k(d),"value":k(1)}},{"request_put":{"key":k(d),"value":k(2)}}]}`),
		post("/v3/lease/grant", `{"TTL":"9000000001"}`),
		{method: http.MethodPost, path: "/v3/kv/range", body: `{"key":`, codeOnly: true},
		{method: http.MethodPost, path: "/v3/kv/range", body: j(`{"key":k(a),"sort_order":"SIDEWAYS"}`), codeOnly: true},
		{method: http.MethodGet, path: "/v3/kv/range"},
		post("/v3/kv/nothing", `{}`),
		// Cluster, maintenance, auth: what both servers share.
		{method: http.MethodPost, path: "/v3/maintenance/status", body: `{}`, fields: []string{"version"}},
		{method: http.MethodPost, path: "/v3/maintenance/alarm", body: `{"action":"GET"}`},
		{method: http.MethodPost, path: "/v3/auth/status", body: `{}`, fields: []string{"enabled"}},
	}
}

// gwRecorder sends the workload to one server and writes down the
// normalized answers.
type gwRecorder struct {
	base   string
	hc     *http.Client
	writes []int64           // revisions of key changes, in order
	leases map[string]string // lease id → L1, L2, … in grant order
	ids    map[string]string // L1, L2, … → the server's lease id
	out    []string
}

func (r *gwRecorder) rev(v string) string {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n == 0 {
		return v
	}
	return "r" + strconv.Itoa(sort.Search(len(r.writes), func(i int) bool { return r.writes[i] > n }))
}

func (r *gwRecorder) lease(id string) string {
	if l, ok := r.leases[id]; ok {
		return l
	}
	if id == "" || id == "0" {
		return id
	}
	return "unknown lease"
}

// norm rewrites an answer's values that differ between servers.
func (r *gwRecorder) norm(v any, key string) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if k == "header" {
				h, _ := e.(map[string]any)
				out[k] = map[string]any{"revision": r.rev(fmt.Sprint(h["revision"]))}
				continue
			}
			out[k] = r.norm(e, k)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = r.norm(e, key)
		}
		return out
	case string:
		switch key {
		case "revision", "create_revision", "mod_revision", "compact_revision":
			return r.rev(x)
		case "ID", "lease", "id":
			return r.lease(x)
		}
	}
	return v
}

func (r *gwRecorder) do(t *testing.T, s gwStep) {
	t.Helper()
	body := s.body
	for l, id := range r.ids { // a workload's L1, L2: this server's ids
		body = strings.ReplaceAll(body, `"`+l+`"`, `"`+id+`"`)
	}
	req, err := http.NewRequest(s.method, r.base+s.path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", s.method, s.path, err)
	}
	defer resp.Body.Close()
	var raw []byte
	if s.stream {
		raw, err = bufio.NewReader(resp.Body).ReadBytes('\n')
	} else {
		raw, err = io.ReadAll(resp.Body)
	}
	if err != nil && !(s.stream && err == io.EOF) {
		t.Fatalf("%s %s: reading the answer: %v", s.method, s.path, err)
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		r.log(s, resp, strings.TrimSpace(string(raw)))
		return
	}
	m, _ := v.(map[string]any)
	if h, ok := m["header"].(map[string]any); ok && s.write && resp.StatusCode == http.StatusOK {
		if rev, err := strconv.ParseInt(fmt.Sprint(h["revision"]), 10, 64); err == nil && (len(r.writes) == 0 || rev > r.writes[len(r.writes)-1]) {
			r.writes = append(r.writes, rev)
		}
	}
	if s.path == "/v3/lease/grant" && resp.StatusCode == http.StatusOK {
		id := fmt.Sprint(m["ID"])
		l := fmt.Sprintf("L%d", len(r.leases)+1)
		r.leases[id], r.ids[l] = l, id
	}
	switch {
	case s.codeOnly:
		v = map[string]any{"code": m["code"]}
	case s.fields != nil:
		kept := map[string]any{}
		for _, f := range s.fields {
			kept[f] = m[f]
		}
		v = kept
	}
	if strings.Contains(s.path, "timetolive") && m["TTL"] != nil && m["TTL"] != "-1" {
		m["TTL"] = "remaining" // seconds left: a matter of timing
	}
	if keys, ok := m["keys"].([]any); ok && strings.Contains(s.path, "timetolive") {
		// etcd lists a lease's keys in its map's order, which varies.
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
	}
	b, _ := json.Marshal(r.norm(v, ""))
	r.log(s, resp, string(b))
}

func (r *gwRecorder) log(s gwStep, resp *http.Response, answer string) {
	r.out = append(r.out, fmt.Sprintf("%s %s %s → %d %s", s.method, s.path, s.body, resp.StatusCode, answer))
}

// watchStep opens a watch through the gateway, changes keys through it,
// and records the events the stream delivers.
func (r *gwRecorder) watch(t *testing.T) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.base+"/v3/watch", strings.NewReader(j(`{"create_request":{"key":k(w/),"range_end":k(w0),"prev_kv":true}}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		br := bufio.NewReader(resp.Body)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			lines <- l
		}
	}()
	nextLine := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the watch stream ended")
			}
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no watch answer within 10s")
		}
		return ""
	}
	record := func(what, l string) {
		var v any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("watch answer %q: %v", l, err)
		}
		b, _ := json.Marshal(r.norm(v, ""))
		r.out = append(r.out, "watch "+what+": "+string(b))
	}
	record("created", nextLine())
	for _, s := range []gwStep{
		{method: http.MethodPost, path: "/v3/kv/put", body: j(`{"key":k(w/1),"value":k(a)}`), write: true},
		{method: http.MethodPost, path: "/v3/kv/put", body: j(`{"key":k(w/1),"value":k(b)}`), write: true},
		{method: http.MethodPost, path: "/v3/kv/deleterange", body: j(`{"key":k(w/1)}`), write: true},
	} {
		r.do(t, s)
		record("event", nextLine())
	}
}

func runGatewayWorkload(t *testing.T, endpoint string) []string {
	t.Helper()
	r := &gwRecorder{base: "http://" + endpoint, hc: &http.Client{Timeout: 30 * time.Second}, leases: map[string]string{}, ids: map[string]string{}}
	for _, s := range gwWorkload() {
		r.do(t, s)
	}
	r.watch(t)
	return r.out
}

// TestGatewayDifferential sends the same JSON requests to a real etcd
// 3.7.3's gateway and to Tenure's, and compares every answer (see
// gwRecorder for what is normalized).
func TestGatewayDifferential(t *testing.T) {
	etcdOut := runGatewayWorkload(t, startEtcd(t))
	tenureOut := runGatewayWorkload(t, startTenure(t).Etcd)
	if len(etcdOut) != len(tenureOut) {
		t.Fatalf("%d answers from etcd, %d from Tenure", len(etcdOut), len(tenureOut))
	}
	bad := 0
	for i := range etcdOut {
		if etcdOut[i] != tenureOut[i] {
			t.Errorf("step %d:\n  etcd:   %s\n  tenure: %s", i, etcdOut[i], tenureOut[i])
			bad++
		}
	}
	if bad == 0 {
		t.Logf("%d answers, all equal:\n%s", len(etcdOut), strings.Join(etcdOut, "\n"))
	}
}
