package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeployExamples: the systemd units and the config file under
// examples/deploy parse with this version's serve flags, so they cannot
// fall behind the flags they use. (e2e's TestDeploy* run them.)
func TestDeployExamples(t *testing.T) {
	units, err := filepath.Glob("../../examples/deploy/*.service")
	if err != nil || len(units) < 2 {
		t.Fatalf("units %v %v", units, err)
	}
	expand := strings.NewReplacer("%i", "n1", "${TENURE_LISTEN}", "10.0.0.1:7070", "${TENURE_PEER}", "10.0.0.1:7072", "${TENURE_HTTP}", "127.0.0.1:7071")
	for _, unit := range units {
		b, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		var exec string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
				exec = expand.Replace(v)
			}
		}
		args := strings.Fields(exec)
		if len(args) < 2 || filepath.Base(args[0]) != "tenure" || args[1] != "serve" {
			t.Fatalf("%s: ExecStart %q is not tenure serve", unit, exec)
		}
		cmd := (&app{}).serveCommand()
		if err := cmd.ParseFlags(args[2:]); err != nil {
			t.Errorf("%s: %v", unit, err)
		}
	}
	cmd := (&app{}).serveCommand()
	if err := applyConfigFile(cmd.Flags(), "../../examples/deploy/tenure.yaml"); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("data-dir").Value.String(); got != "/var/lib/tenure" {
		t.Fatalf("data-dir from the config file: %q", got)
	}
	if got := cmd.Flags().Lookup("auth").Value.String(); got != "true" {
		t.Fatalf("auth from the config file: %q", got)
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cmd := (&app{}).serveCommand()
	if err := cmd.ParseFlags([]string{"--listen", "127.0.0.1:9999"}); err != nil {
		t.Fatal(err)
	}
	p := write("listen: 127.0.0.1:1111\ndata-dir: /tmp/x\nbootstrap-peers: {n1: '127.0.0.1:7071', n2: '127.0.0.1:7072'}\ngroup-commit-wait: 1ms\n")
	if err := applyConfigFile(cmd.Flags(), p); err != nil {
		t.Fatal(err)
	}
	f := cmd.Flags()
	if got := f.Lookup("listen").Value.String(); got != "127.0.0.1:9999" {
		t.Errorf("listen %q: the command line must win", got)
	}
	if got := f.Lookup("bootstrap-peers").Value.String(); got != "n1=127.0.0.1:7071,n2=127.0.0.1:7072" {
		t.Errorf("bootstrap-peers %q", got)
	}
	if got := f.Lookup("group-commit-wait").Value.String(); got != "1ms" {
		t.Errorf("group-commit-wait %q", got)
	}
	for body, want := range map[string]string{
		"no-such-flag: 1\n":    `"no-such-flag" is not a flag`,
		"max-sessions: lots\n": "max-sessions",
		"listen: [a, [b]]\n":   "a list of plain values",
		"- not\n- a mapping\n": "not valid YAML",
	} {
		err := applyConfigFile((&app{}).serveCommand().Flags(), write(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: %v, want an error saying %q", body, err, want)
		}
	}
}
