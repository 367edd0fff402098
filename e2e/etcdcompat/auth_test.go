package etcdcompat

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// tenureCLI runs the tenure CLI against endpoint with the auth token
// secret token and returns its stdout.
func tenureCLI(t *testing.T, endpoint, token string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "tenure"), append(args, "--endpoint", endpoint, "--auth-token", token)...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("tenure %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("tenure %v: %v", args, err)
	}
	return string(out)
}

// TestEtcdctlAuth: on `tenure serve --auth --etcd-listen`, an etcdctl
// script of etcd's own user and role commands, run with a Tenure token's
// id and secret as user and password, makes a user whose role then
// decides etcdctl's and clientv3's requests; anonymous and unauthorized
// requests get etcd's errors.
func TestEtcdctlAuth(t *testing.T) {
	srv := startTenure(t, "--auth")
	var boot struct{ ID, Secret string }
	if err := json.Unmarshal([]byte(tenureCLI(t, srv.Listen, "", "acl", "bootstrap", "-o", "json")), &boot); err != nil {
		t.Fatal(err)
	}
	admin := []string{"--user", boot.ID, "--password", boot.Secret}
	const password = "correct-horse-battery-staple"
	for _, step := range [][]string{
		{"role", "add", "root"},
		{"role", "add", "app"},
		{"role", "grant-permission", "app", "readwrite", "app/", "--prefix"},
		{"role", "grant-permission", "app", "read", "pub/", "--prefix"},
		{"user", "add", "alice", "--new-user-password=" + password},
		{"user", "grant-role", "alice", "app"},
		{"auth", "enable"},
	} {
		etcdctl(t, srv.Etcd, "", append(admin, step...)...)
	}
	if out := etcdctl(t, srv.Etcd, "", append(admin, "user", "get", "alice")...); !strings.Contains(out, "app") {
		t.Fatalf("user get alice: %q", out)
	}
	if out := etcdctl(t, srv.Etcd, "", append(admin, "role", "get", "app")...); !strings.Contains(out, "app/") || !strings.Contains(out, "pub/") {
		t.Fatalf("role get app: %q", out)
	}
	if out := etcdctl(t, srv.Etcd, "", append(admin, "auth", "status")...); !strings.Contains(out, "true") {
		t.Fatalf("auth status: %q", out)
	}
	alice := []string{"--user", "alice", "--password", password}
	etcdctl(t, srv.Etcd, "", append(alice, "put", "app/1", "v1")...)
	if out := etcdctl(t, srv.Etcd, "", append(alice, "get", "app/", "--prefix", "--print-value-only")...); strings.TrimSpace(out) != "v1" {
		t.Fatalf("get as alice: %q", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(alice, "put", "pub/1", "x"), "permission denied"},
		{append(alice, "get", "app/", "--from-key"), "permission denied"},
		{append(alice, "user", "add", "mallory", "--new-user-password=whatever-long"), "permission denied"},
		{[]string{"get", "app/1"}, "user name is empty"},
		{[]string{"--user", "alice", "--password", "wrong", "get", "app/1"}, "authentication failed"},
		{append(admin, "role", "grant-permission", "app", "read", "one-key"), "prefixes"},
	} {
		_, errOut, err := etcdctlRun(srv.Etcd, "", c.args...)
		if err == nil || !strings.Contains(errOut, c.want) {
			t.Errorf("etcdctl %v: %v %q, want an error with %q", c.args, err, errOut, c.want)
		}
	}
	// clientv3 with a user name and password.
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Etcd}, Username: "alice", Password: password, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := tctx(t)
	if _, err := c.Put(ctx, "app/2", "v2"); err != nil {
		t.Fatalf("clientv3 put: %v", err)
	}
	if r, err := c.Get(ctx, "app/", clientv3.WithPrefix()); err != nil || r.Count != 2 {
		t.Fatalf("clientv3 get: %v %v", r, err)
	}
	if _, err := c.Put(ctx, "pub/2", "x"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("clientv3 put outside the role: %v, want %v", err, rpctypes.ErrPermissionDenied)
	}
	anon := client(t, srv.Etcd)
	if _, err := anon.Get(ctx, "app/1"); !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Fatalf("anonymous clientv3 get: %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	// The Tenure token works as an etcd user directly.
	if out := etcdctl(t, srv.Etcd, "", append(admin, "get", "app/2", "--print-value-only")...); strings.TrimSpace(out) != "v2" {
		t.Fatalf("get as the management token: %q", out)
	}
}
