package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

// The systemd units under examples/deploy are run as systemd would run
// them: their ExecStart line with the instance name (%i) and the
// variables of their EnvironmentFile expanded, against the files they
// name, which the test puts in a directory of its own: TLS material from
// `tenure cert dev` in place of /etc/tenure/tls, the config file in place
// of /etc/tenure, and a data directory in place of /var/lib/tenure.

// systemdUnit is what the test runs of a unit file.
type systemdUnit struct {
	execStart string
	envFile   string // EnvironmentFile, "" for none
}

func readUnit(t *testing.T, name string) systemdUnit {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../examples/deploy", name))
	if err != nil {
		t.Fatal(err)
	}
	var u systemdUnit
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			u.execStart = v
		}
		if v, ok := strings.CutPrefix(line, "EnvironmentFile="); ok {
			u.envFile = v
		}
	}
	if u.execStart == "" {
		t.Fatalf("%s has no ExecStart", name)
	}
	if strings.ContainsAny(u.execStart, `"'\`) {
		t.Fatalf("%s: ExecStart has quotes or escapes, which this test does not expand: %s", name, u.execStart)
	}
	return u
}

// readEnvFile reads an EnvironmentFile: VAR=value lines, # comments.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is no VAR=value line", path, line)
		}
		env[k] = v
	}
	return env
}

var unitVar = regexp.MustCompile(`\$\{([A-Z_]+)\}`)

// expand is the command line systemd runs for instance: %i and ${VAR}
// expanded (each variable one word), then split into words, and paths
// rewritten by root.
func (u systemdUnit) expand(t *testing.T, instance string, env map[string]string, root *strings.Replacer) []string {
	t.Helper()
	line := strings.ReplaceAll(u.execStart, "%i", instance)
	line = unitVar.ReplaceAllStringFunc(line, func(v string) string {
		val, ok := env[unitVar.FindStringSubmatch(v)[1]]
		if !ok {
			t.Fatalf("ExecStart uses %s, which the environment file does not set", v)
		}
		return val
	})
	if strings.ContainsAny(line, "$%") {
		t.Fatalf("ExecStart has a variable or specifier this test does not expand: %s", line)
	}
	return strings.Fields(root.Replace(line))
}

// deployRoot makes a directory standing for the host's /etc/tenure, with
// the TLS files of `tenure cert dev` in tls/.
func deployRoot(t *testing.T) string {
	t.Helper()
	etc := filepath.Join(t.TempDir(), "etc-tenure")
	if r := tenure(t, "127.0.0.1:1", "cert", "dev", "--dir", filepath.Join(etc, "tls")); r.code != 0 {
		t.Fatalf("cert dev: exit %d, %s", r.code, r.stderr)
	}
	return etc
}

// hostPaths rewrites a unit's paths: the binary to the test's, /etc/tenure
// to etc, /var/lib/tenure to dataDir.
func hostPaths(etc, dataDir string) *strings.Replacer {
	return strings.NewReplacer(
		"/usr/local/bin/tenure", filepath.Join(binDir, "tenure"),
		"/etc/tenure/", etc+"/",
		"/var/lib/tenure", dataDir,
	)
}

// clientTLS is the environment of a client with the development client
// certificate of etc.
func clientTLS(etc string) []string {
	tls := filepath.Join(etc, "tls")
	return []string{"TENURE_CACERT=" + filepath.Join(tls, "ca.pem"), "TENURE_CERT=" + filepath.Join(tls, "client.pem"), "TENURE_KEY=" + filepath.Join(tls, "client-key.pem")}
}

// runWith runs one tenure command against endpoint with extra
// environment; stdout and stderr together in result.stdout.
func runWith(t *testing.T, endpoint string, extra []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "tenure"), args...)
	cmd.Env = append(env(endpoint), extra...)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("tenure %v did not finish in 60s", args)
	}
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatal(err)
		}
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: string(out)}
}

// waitServing waits for p's ready line.
func waitServing(t *testing.T, p *proc) {
	t.Helper()
	testutil.WaitFor(t, p.name+"'s ready line", 30*time.Second, func() bool {
		if p.exited() {
			t.Fatalf("%s exited with %d: %s", p.name, p.status, p.stderr())
		}
		return strings.HasPrefix(p.stdout(), "tenure: serving on ")
	})
}

// TestDeployMemberUnitsStart runs tenure-member@.service as shipped for
// n1, n2 and n3, each with member.env as its host would have it (its own
// addresses; here loopback ports of the test's own), against TLS
// material (one CA's, standing for each host's): the three become ready;
// a client without TLS is refused, and one with the CA and a client
// certificate bootstraps the ACLs, which --auth then enforces.
func TestDeployMemberUnitsStart(t *testing.T) {
	u := readUnit(t, "tenure-member@.service")
	if u.envFile != "/etc/tenure/member.env" {
		t.Fatalf("EnvironmentFile %q", u.envFile)
	}
	shipped := readEnvFile(t, "../examples/deploy/member.env")
	etc := deployRoot(t)
	hostAddr := regexp.MustCompile(`10\.0\.0\.[0-9]+:[0-9]+`)
	// Host K's addresses (10.0.0.K:PORT) are one loopback port each, the
	// same in every instance's environment and in --bootstrap-peers.
	own := map[string]string{}
	local := func(s string) string {
		return hostAddr.ReplaceAllStringFunc(s, func(a string) string {
			if own[a] == "" {
				own[a] = freeAddr(t)
			}
			return own[a]
		})
	}
	var ps []*proc
	var endpoints []string
	for k := 1; k <= 3; k++ {
		id := fmt.Sprintf("n%d", k)
		env := map[string]string{}
		for v, val := range shipped {
			val = strings.ReplaceAll(val, "10.0.0.1:", fmt.Sprintf("10.0.0.%d:", k))
			if strings.HasPrefix(val, "127.0.0.1:") {
				val = freeAddr(t) // each host has a loopback of its own
			}
			env[v] = local(val)
		}
		args := u.expand(t, id, env, hostPaths(etc, filepath.Join(t.TempDir(), "var-lib-tenure")))
		for i, a := range args {
			args[i] = local(a)
		}
		ps = append(ps, startExec(t, id, "", exec.Command(args[0], args[1:]...)))
		endpoints = append(endpoints, env["TENURE_LISTEN"])
	}
	for _, p := range ps {
		waitServing(t, p)
	}
	eps := strings.Join(endpoints, ",")
	if r := runWith(t, endpoints[0], nil, "status"); r.code == 0 {
		t.Fatalf("status in plaintext: exit 0, want a refusal:\n%s", r.stdout)
	}
	r := runWith(t, eps, clientTLS(etc), "acl", "bootstrap", "-o", "json")
	secret := regexp.MustCompile(`"secret":"([^"]+)"`).FindStringSubmatch(r.stdout)
	if r.code != 0 || secret == nil {
		t.Fatalf("acl bootstrap: exit %d\n%s", r.code, r.stdout)
	}
	if r := runWith(t, eps, clientTLS(etc), "lock", "x", "--", "true"); r.code != 1 || !strings.Contains(r.stdout, "permission denied") {
		t.Fatalf("a lock without a token under --auth: exit %d\n%s", r.code, r.stdout)
	}
	if r := runWith(t, eps, append(clientTLS(etc), "TENURE_AUTH_TOKEN="+secret[1]), "status", "--wait", "30s"); r.code != 0 {
		t.Fatalf("status with the management token: exit %d\n%s", r.code, r.stdout)
	}
}

// TestDeployMemberUnitPassesProtectedMode runs tenure-member@.service's
// command line with member.env's addresses as shipped (10.0.0.1, which
// this machine does not have): protected mode lets it through, and it
// stops only where it binds its address. (The unit shipped without TLS
// and --auth was refused here.)
func TestDeployMemberUnitPassesProtectedMode(t *testing.T) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if strings.HasPrefix(a.String(), "10.0.0.") {
			t.Skipf("this machine has %s: the test would listen outside loopback", a)
		}
	}
	u := readUnit(t, "tenure-member@.service")
	env := readEnvFile(t, "../examples/deploy/member.env")
	env["TENURE_HTTP"] = freeAddr(t)
	args := u.expand(t, "n1", env, hostPaths(deployRoot(t), filepath.Join(t.TempDir(), "var-lib-tenure")))
	p := startExec(t, "n1", "", exec.Command(args[0], args[1:]...))
	if code := p.wait(30 * time.Second); code == 0 {
		t.Fatalf("serve on 10.0.0.1 exited 0")
	}
	if se := p.stderr(); strings.Contains(se, "refusing") || !strings.Contains(se, "assign requested address") {
		t.Fatalf("serve on 10.0.0.1 should pass protected mode and fail to bind; stderr:\n%s", se)
	}
}

// TestDeploySingleNodeUnitStarts runs tenure.service as shipped, with
// tenure.yaml (its addresses replaced by loopback ports of the test's
// own): it becomes ready with TLS and --auth.
func TestDeploySingleNodeUnitStarts(t *testing.T) {
	u := readUnit(t, "tenure.service")
	etc := deployRoot(t)
	paths := hostPaths(etc, filepath.Join(t.TempDir(), "var-lib-tenure"))
	b, err := os.ReadFile("../examples/deploy/tenure.yaml")
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	conf := strings.NewReplacer("127.0.0.1:7070", addr, "127.0.0.1:7071", freeAddr(t)).Replace(paths.Replace(string(b)))
	if !strings.Contains(conf, addr) || !strings.Contains(conf, "auth: true") || !strings.Contains(conf, "tls-cert:") {
		t.Fatalf("tenure.yaml should listen on 127.0.0.1:7070 with TLS and auth:\n%s", b)
	}
	if err := os.WriteFile(filepath.Join(etc, "tenure.yaml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	args := u.expand(t, "", nil, paths)
	p := startExec(t, "tenure.service", addr, exec.Command(args[0], args[1:]...))
	waitServing(t, p)
	if r := runWith(t, addr, nil, "status"); r.code == 0 {
		t.Fatalf("status in plaintext: exit 0, want a refusal:\n%s", r.stdout)
	}
	if r := runWith(t, addr, clientTLS(etc), "acl", "bootstrap"); r.code != 0 {
		t.Fatalf("acl bootstrap over TLS: exit %d, %s", r.code, r.stdout)
	}
}
