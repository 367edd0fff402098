package etcdapi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/etcdapi"
	"github.com/tenure-io/tenure/internal/server"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func unb64(t *testing.T, v any) string {
	t.Helper()
	s, _ := v.(string)
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("not base64: %v", v)
	}
	return string(b)
}

// gwClient speaks etcd's JSON gateway as curl and etcd's HTTP clients
// do: a JSON body POSTed, a JSON answer.
type gwClient struct {
	base  string // http://host:port or https://host:port
	hc    *http.Client
	token string // sent as etcd's Authorization header
}

// http1 is a client of addr over HTTP/1.1 (new connections per client).
func http1(addr string) gwClient {
	return gwClient{base: "http://" + addr, hc: &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}}
}

// h2c is a client of addr over HTTP/2 without TLS (prior knowledge).
func h2c(addr string) gwClient {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return gwClient{base: "http://" + addr, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

func (g gwClient) do(t *testing.T, method, path string, body any) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctxT(t), method, g.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if g.token != "" {
		req.Header.Set("Authorization", g.token)
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// post POSTs body to path and decodes the JSON answer; it fails the test
// unless the status is want.
func (g gwClient) post(t *testing.T, path string, body any, want int) map[string]any {
	t.Helper()
	resp, b := g.do(t, http.MethodPost, path, body)
	if resp.StatusCode != want {
		t.Fatalf("POST %s: %d %s, want %d", path, resp.StatusCode, b, want)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("POST %s: not JSON: %q", path, b)
	}
	return m
}

// stream POSTs body to a streaming path and returns a decoder of the
// answers, one JSON object each ({"result": ...} or {"error": ...}).
func (g gwClient) stream(t *testing.T, path string, body any) *json.Decoder {
	t.Helper()
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.base+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if g.token != "" {
		req.Header.Set("Authorization", g.token)
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body)
}

// next decodes the next answer of a stream, within 10 s.
func next(t *testing.T, d *json.Decoder) map[string]any {
	t.Helper()
	got := make(chan map[string]any, 1)
	errc := make(chan error, 1)
	go func() {
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			errc <- err
			return
		}
		got <- m
	}()
	select {
	case m := <-got:
		return m
	case err := <-errc:
		t.Fatalf("stream: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("stream: no answer within 10s")
	}
	return nil
}

// sameJSON reports whether b is the JSON value want (protojson varies
// its spacing from build to build on purpose).
func sameJSON(b []byte, want string) bool {
	var x, y any
	if json.Unmarshal(b, &x) != nil || json.Unmarshal([]byte(want), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

func field(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

// TestGatewayVersionAndHealth: /version names etcd's version and the
// cluster version Patroni chooses its API prefix by, consistent with
// Status; /health is etcd's answer; both only for GET.
func TestGatewayVersionAndHealth(t *testing.T) {
	e := start(t, daemon.Config{})
	g := http1(e.srv.EtcdAddr())
	resp, b := g.do(t, http.MethodGet, "/version", nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/version: %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var v struct{ Etcdserver, Etcdcluster string }
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	st, err := e.maint.Status(ctxT(t), &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Etcdserver != st.Version || !strings.HasPrefix(v.Etcdcluster, "3.") || !strings.HasPrefix(st.Version, strings.TrimSuffix(v.Etcdcluster, "0")) {
		t.Fatalf("/version %s, Status's version %s", b, st.Version)
	}
	resp, b = g.do(t, http.MethodGet, "/health", nil)
	if resp.StatusCode != http.StatusOK || !sameJSON(b, `{"health":"true","reason":""}`) {
		t.Fatalf("/health: %d %s", resp.StatusCode, b)
	}
	resp, b = g.do(t, http.MethodGet, "/health?serializable=true", nil)
	if resp.StatusCode != http.StatusOK || !sameJSON(b, `{"health":"true","reason":""}`) {
		t.Fatalf("/health?serializable=true: %d %s", resp.StatusCode, b)
	}
	for _, p := range []string{"/version", "/health"} {
		if resp, _ := g.do(t, http.MethodPost, p, nil); resp.StatusCode != http.StatusMethodNotAllowed {
			t.Fatalf("POST %s: %d", p, resp.StatusCode)
		}
	}
	if resp, _ := g.do(t, http.MethodGet, "/nothing", nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/nothing: %d", resp.StatusCode)
	}
}

// TestGatewayKV: keys and values in base64, as etcd's gateway maps
// them; /v3beta/ and /v3alpha/ are /v3/; snake_case names and int64s as
// strings, as etcd's marshaler writes them; what gRPC clients see is the
// same store.
func TestGatewayKV(t *testing.T) {
	e := start(t, daemon.Config{})
	g := http1(e.srv.EtcdAddr())
	put := g.post(t, "/v3/kv/put", map[string]any{"key": b64("gw/a"), "value": b64("1")}, http.StatusOK)
	rev, _ := field(put, "header", "revision").(string)
	if rev == "" || field(put, "header", "cluster_id") == nil || field(put, "header", "member_id") == nil || field(put, "header", "raft_term") == nil {
		t.Fatalf("put's header: %v", put)
	}
	g.post(t, "/v3beta/kv/put", map[string]any{"key": b64("gw/b"), "value": b64("2")}, http.StatusOK)
	g.post(t, "/v3alpha/kv/put", map[string]any{"key": b64("gw/c"), "value": b64("3")}, http.StatusOK)
	for _, prefix := range []string{"/v3", "/v3beta", "/v3alpha"} {
		r := g.post(t, prefix+"/kv/range", map[string]any{"key": b64("gw/"), "range_end": b64("gw0")}, http.StatusOK)
		kvs, _ := r["kvs"].([]any)
		if len(kvs) != 3 || r["count"] != "3" {
			t.Fatalf("%s/kv/range: %v", prefix, r)
		}
		first := kvs[0].(map[string]any)
		if unb64(t, first["key"]) != "gw/a" || unb64(t, first["value"]) != "1" || first["create_revision"] != rev || first["mod_revision"] != rev || first["version"] != "1" {
			t.Fatalf("%s/kv/range: first %v (put at %s)", prefix, first, rev)
		}
	}
	// The same store as gRPC's.
	if r, err := e.kv.Range(ctxT(t), &pb.RangeRequest{Key: []byte("gw/b")}); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "2" {
		t.Fatalf("gRPC range of a key the gateway put: %v %v", r, err)
	}
	txn := g.post(t, "/v3/kv/txn", map[string]any{
		"compare": []any{map[string]any{"key": b64("gw/a"), "target": "VALUE", "result": "EQUAL", "value": b64("1")}},
		"success": []any{map[string]any{"request_put": map[string]any{"key": b64("gw/a"), "value": b64("10")}}},
	}, http.StatusOK)
	if txn["succeeded"] != true {
		t.Fatalf("txn: %v", txn)
	}
	del := g.post(t, "/v3/kv/deleterange", map[string]any{"key": b64("gw/"), "range_end": b64("gw0"), "prev_kv": true}, http.StatusOK)
	if del["deleted"] != "3" || len(del["prev_kvs"].([]any)) != 3 {
		t.Fatalf("deleterange: %v", del)
	}
	// An empty answer has no fields but its header, as etcd's.
	r := g.post(t, "/v3/kv/range", map[string]any{"key": b64("gw/a")}, http.StatusOK)
	if len(r) != 1 || r["header"] == nil {
		t.Fatalf("range of a deleted key: %v", r)
	}
}

// TestGatewayErrors: errors as etcd's gateway answers them (the HTTP
// status of the gRPC code, {"code","message"}), and what the listener
// refuses before the gateway.
func TestGatewayErrors(t *testing.T) {
	e := start(t, daemon.Config{})
	g := http1(e.srv.EtcdAddr())
	resp, b := g.do(t, http.MethodPost, "/v3/kv/put", map[string]any{"value": b64("v")})
	if resp.StatusCode != http.StatusBadRequest || !sameJSON(b, `{"code":3,"message":"etcdserver: key is not provided"}`) {
		t.Fatalf("put without a key: %d %s", resp.StatusCode, b)
	}
	resp, b = g.do(t, http.MethodPost, "/v3/lease/revoke", map[string]any{"ID": "12345"})
	if resp.StatusCode != http.StatusNotFound || !sameJSON(b, `{"code":5,"message":"etcdserver: requested lease not found"}`) {
		t.Fatalf("revoke of no lease: %d %s", resp.StatusCode, b)
	}
	resp, b = g.do(t, http.MethodPost, "/v3/kv/range", "not an object")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"code":3`) {
		t.Fatalf("a body that is not a request: %d %s", resp.StatusCode, b)
	}
	// A body past the bound is refused, and the server goes on.
	big := map[string]any{"key": b64("big"), "value": strings.Repeat("A", 4<<20)}
	if resp, b := g.do(t, http.MethodPost, "/v3/kv/put", big); resp.StatusCode == http.StatusOK {
		t.Fatalf("a 4 MiB body: %d %.200s", resp.StatusCode, b)
	}
	// A page in a browser cannot use the API.
	req, _ := http.NewRequestWithContext(ctxT(t), http.MethodPost, g.base+"/v3/kv/put", strings.NewReader(`{"key":"`+b64("x")+`"}`))
	req.Header.Set("Origin", "http://evil.example")
	resp, err := g.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a request with Origin: %d", resp.StatusCode)
	}
	if r, err := e.kv.Range(ctxT(t), &pb.RangeRequest{Key: []byte("x")}); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the refused request wrote: %v %v", r, err)
	}
	g.post(t, "/v3/kv/put", map[string]any{"key": b64("after"), "value": b64("ok")}, http.StatusOK)
}

// TestGatewayWatchStream: a watch over HTTP/1.1 streams etcd's answers
// ({"result": WatchResponse}) as the keys change, whoever changes them.
func TestGatewayWatchStream(t *testing.T) {
	e := start(t, daemon.Config{})
	g := http1(e.srv.EtcdAddr())
	d := g.stream(t, "/v3/watch", map[string]any{"create_request": map[string]any{"key": b64("w/"), "range_end": b64("w0")}})
	created := next(t, d)
	if field(created, "result", "created") != true {
		t.Fatalf("first answer: %v", created)
	}
	e.put(t, "w/1", "one", 0)
	g.post(t, "/v3/kv/put", map[string]any{"key": b64("w/2"), "value": b64("two")}, http.StatusOK)
	var got []string
	for len(got) < 2 {
		m := next(t, d)
		evs, _ := field(m, "result", "events").([]any)
		for _, ev := range evs {
			kv := ev.(map[string]any)["kv"].(map[string]any)
			got = append(got, unb64(t, kv["key"])+"="+unb64(t, kv["value"]))
		}
	}
	if strings.Join(got, " ") != "w/1=one w/2=two" {
		t.Fatalf("events: %v", got)
	}
}

// TestGatewayLeaseKeepAlive: grant, keep alive over the streaming
// keepalive (one request, one answer, as etcd3gw and Patroni use it),
// time to live, revoke.
func TestGatewayLeaseKeepAlive(t *testing.T) {
	e := start(t, daemon.Config{})
	g := http1(e.srv.EtcdAddr())
	gr := g.post(t, "/v3/lease/grant", map[string]any{"TTL": "30"}, http.StatusOK)
	id, _ := gr["ID"].(string)
	if id == "" || gr["TTL"] != "30" {
		t.Fatalf("grant: %v", gr)
	}
	g.post(t, "/v3/kv/put", map[string]any{"key": b64("l/k"), "value": b64("v"), "lease": id}, http.StatusOK)
	d := g.stream(t, "/v3/lease/keepalive", map[string]any{"ID": id})
	ka := next(t, d)
	if field(ka, "result", "ID") != id || field(ka, "result", "TTL") != "30" {
		t.Fatalf("keepalive: %v", ka)
	}
	ttl := g.post(t, "/v3/lease/timetolive", map[string]any{"ID": id, "keys": true}, http.StatusOK)
	keys, _ := ttl["keys"].([]any)
	if ttl["grantedTTL"] != "30" || len(keys) != 1 || unb64(t, keys[0]) != "l/k" {
		t.Fatalf("timetolive: %v", ttl)
	}
	leases := g.post(t, "/v3/lease/leases", map[string]any{}, http.StatusOK)
	if ls, _ := leases["leases"].([]any); len(ls) != 1 {
		t.Fatalf("leases: %v", leases)
	}
	g.post(t, "/v3/lease/revoke", map[string]any{"ID": id}, http.StatusOK)
	if r, err := e.kv.Range(ctxT(t), &pb.RangeRequest{Key: []byte("l/k")}); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the lease's key after the revoke: %v %v", r, err)
	}
	// A keepalive of a lease that is gone answers TTL 0, as etcd's.
	ka = next(t, g.stream(t, "/v3/lease/keepalive", map[string]any{"ID": id}))
	if field(ka, "result", "TTL") != nil {
		t.Fatalf("keepalive of a revoked lease: %v", ka)
	}
}

// TestGatewayAuth: under --auth the gateway takes etcd's token header
// (Authorization: <token> from /v3/auth/authenticate), and the token's
// rules decide as on gRPC; no token is etcd's "user name is empty".
func TestGatewayAuth(t *testing.T) {
	e, n, _ := startAuth(t)
	tok := n.token(t, "app", "kv:app/:write")
	g := http1(e.srv.EtcdAddr())
	resp, b := g.do(t, http.MethodPost, "/v3/kv/put", map[string]any{"key": b64("app/x"), "value": b64("v")})
	if resp.StatusCode != http.StatusBadRequest || !sameJSON(b, `{"code":3,"message":"etcdserver: user name is empty"}`) {
		t.Fatalf("put without a token: %d %s", resp.StatusCode, b)
	}
	resp, _ = g.do(t, http.MethodPost, "/v3/auth/authenticate", map[string]any{"name": tok.GetId(), "password": "wrong"})
	if resp.StatusCode == http.StatusOK {
		t.Fatal("authenticated with a wrong password")
	}
	a := g.post(t, "/v3/auth/authenticate", map[string]any{"name": tok.GetId(), "password": tok.GetSecret()}, http.StatusOK)
	token, _ := a["token"].(string)
	if token == "" {
		t.Fatalf("authenticate: %v", a)
	}
	g.token = token
	g.post(t, "/v3/kv/put", map[string]any{"key": b64("app/x"), "value": b64("v")}, http.StatusOK)
	if r := g.post(t, "/v3/kv/range", map[string]any{"key": b64("app/x")}, http.StatusOK); r["count"] != "1" {
		t.Fatalf("range with the token: %v", r)
	}
	resp, b = g.do(t, http.MethodPost, "/v3/kv/put", map[string]any{"key": b64("secret/x"), "value": b64("v")})
	if resp.StatusCode != http.StatusForbidden || !sameJSON(b, `{"code":7,"message":"etcdserver: permission denied"}`) {
		t.Fatalf("put outside the token's rules: %d %s", resp.StatusCode, b)
	}
	// etcd's other spelling of the token header.
	g.token = ""
	req, _ := http.NewRequestWithContext(ctxT(t), http.MethodPost, g.base+"/v3/kv/range", strings.NewReader(`{"key":"`+b64("app/x")+`"}`))
	req.Header.Set("Grpc-Metadata-Token", token)
	if resp, err := g.hc.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("range with Grpc-Metadata-Token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// A watch under auth: the token's rules, and nothing else, are seen.
	g.token = token
	d := g.stream(t, "/v3/watch", map[string]any{"create_request": map[string]any{"key": b64("app/"), "range_end": b64("app0")}})
	if c := next(t, d); field(c, "result", "created") != true {
		t.Fatalf("watch with the token: %v", c)
	}
}

// TestGatewaySharesThePort: gRPC (h2c), JSON over HTTP/1.1 and JSON over
// HTTP/2 without TLS, on the one etcd port, interleaved.
func TestGatewaySharesThePort(t *testing.T) {
	e := start(t, daemon.Config{})
	addr := e.srv.EtcdAddr()
	h1, h2 := http1(addr), h2c(addr)
	for i := range 3 {
		e.put(t, fmt.Sprintf("s/%d", i), "grpc", 0)
		h1.post(t, "/v3/kv/put", map[string]any{"key": b64(fmt.Sprintf("s/h1/%d", i)), "value": b64("h1")}, http.StatusOK)
		h2.post(t, "/v3/kv/put", map[string]any{"key": b64(fmt.Sprintf("s/h2/%d", i)), "value": b64("h2")}, http.StatusOK)
	}
	resp, _ := h2.do(t, http.MethodGet, "/version", nil)
	if resp.ProtoMajor != 2 {
		t.Fatalf("the h2c client spoke %s", resp.Proto)
	}
	r := h2.post(t, "/v3/kv/range", map[string]any{"key": b64("s/"), "range_end": b64("s0"), "count_only": true}, http.StatusOK)
	if r["count"] != "9" {
		t.Fatalf("count: %v", r)
	}
	// A watch over HTTP/2 sees a put over gRPC.
	d := h2.stream(t, "/v3/watch", map[string]any{"create_request": map[string]any{"key": b64("s/new")}})
	next(t, d)
	e.put(t, "s/new", "v", 0)
	if m := next(t, d); field(m, "result", "events") == nil {
		t.Fatalf("h2 watch: %v", m)
	}
	if g, err := e.kv.Range(ctxT(t), &pb.RangeRequest{Key: []byte("s/"), RangeEnd: []byte("s0"), CountOnly: true}); err != nil || g.Count != 10 {
		t.Fatalf("gRPC count: %v %v", g, err)
	}
}

// TestGatewayWatchLimitIsPerHTTPConnection: the gateway's requests
// answer to the per-connection watch limit by their own HTTP connection,
// not all together as one.
func TestGatewayWatchLimitIsPerHTTPConnection(t *testing.T) {
	e := start(t, daemon.Config{Limits: server.Limits{KV: server.KVLimits{MaxWatches: 10, MaxWatchesPerConnection: 1}}})
	addr := e.srv.EtcdAddr()
	watch := map[string]any{"create_request": map[string]any{"key": b64("k")}}
	// Two HTTP/1.1 connections: one watch each.
	for i := range 2 {
		if c := next(t, http1(addr).stream(t, "/v3/watch", watch)); field(c, "result", "created") != true {
			t.Fatalf("watch %d on a connection of its own: %v", i, c)
		}
	}
	// Two watches on one HTTP/2 connection: the second is past the limit.
	h2 := h2c(addr)
	if c := next(t, h2.stream(t, "/v3/watch", watch)); field(c, "result", "created") != true {
		t.Fatalf("first watch on the h2 connection: %v", c)
	}
	c := next(t, h2.stream(t, "/v3/watch", watch))
	if field(c, "result", "created") == true && field(c, "result", "canceled") != true {
		t.Fatalf("second watch on one h2 connection: %v", c)
	}
}

// TestGatewayHeaderTimeout: a client that never finishes its request's
// headers is disconnected (slowloris), and the port serves others.
func TestGatewayHeaderTimeout(t *testing.T) {
	defer etcdapi.SetHTTPHeaderTimeout(300 * time.Millisecond)()
	e := start(t, daemon.Config{})
	c, err := net.Dial("tcp", e.srv.EtcdAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("POST /v3/kv/range HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	b, _ := io.ReadAll(bufio.NewReader(c)) // until the server closes
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v (%q)", d, b)
	}
	http1(e.srv.EtcdAddr()).post(t, "/v3/kv/range", map[string]any{"key": b64("k")}, http.StatusOK)
}

// gatewayTLS checks the gateway over TLS at addr: HTTP/1.1 and HTTP/2
// (ALPN), with the client configuration c and a token.
func gatewayTLS(t *testing.T, addr string, c *tls.Config, token string) {
	t.Helper()
	for _, proto := range []string{"http/1.1", "h2"} {
		cc := c.Clone()
		cc.NextProtos = []string{proto}
		tr := &http.Transport{TLSClientConfig: cc, ForceAttemptHTTP2: proto == "h2"}
		g := gwClient{base: "https://" + addr, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}, token: token}
		key := b64("app/tls-" + proto)
		resp, b := g.do(t, http.MethodPost, "/v3/kv/put", map[string]any{"key": key, "value": b64(proto)})
		if resp.StatusCode != http.StatusOK || resp.TLS == nil || resp.TLS.NegotiatedProtocol != proto {
			t.Fatalf("put over %s: %d %s (%v)", proto, resp.StatusCode, b, resp.TLS)
		}
		r := g.post(t, "/v3/kv/range", map[string]any{"key": key}, http.StatusOK)
		if r["count"] != "1" {
			t.Fatalf("range over %s: %v", proto, r)
		}
	}
}
