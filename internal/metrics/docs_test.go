package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// metricRef finds the metric names an expression uses.
var metricRef = regexp.MustCompile(`\b(tenure|go|process)_[a-z0-9_]+`)

// known reports whether name is a metric this package exposes, or a
// series of one of its histograms (_bucket, _sum, _count), or one of the
// Go runtime's and the process's the documents use.
func known(name string) bool {
	if slices.Contains(Names(), name) || slices.Contains([]string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"}, name) {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(Names(), base) {
			return true
		}
	}
	return false
}

// exprs walks v (decoded JSON) and returns every "expr" string in it.
func exprs(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "expr" {
				out = append(out, s)
			} else {
				out = append(out, exprs(e)...)
			}
		}
	case []any:
		for _, e := range x {
			out = append(out, exprs(e)...)
		}
	}
	return out
}

// TestGrafanaDashboardQueriesExist: every metric the Grafana dashboard
// in docs/monitoring queries exists, and it queries every one.
func TestGrafanaDashboardQueriesExist(t *testing.T) {
	b, err := os.ReadFile("../../docs/monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	queried := map[string]bool{}
	es := exprs(dash)
	if len(es) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	for _, e := range es {
		for _, name := range metricRef.FindAllString(e, -1) {
			if !known(name) {
				t.Errorf("the dashboard queries %s, which Tenure does not expose (in %q)", name, e)
			}
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				name = strings.TrimSuffix(name, suffix)
			}
			queried[name] = true
		}
	}
	for _, name := range Names() {
		if !queried[name] {
			t.Errorf("the dashboard shows nothing of %s", name)
		}
	}
}

// TestDocumentedMetrics: the alert rules use only metrics that exist, and
// docs/monitoring.md documents every metric.
func TestDocumentedMetrics(t *testing.T) {
	rules, err := os.ReadFile("../../docs/monitoring/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(rules), "\n") {
		expr, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:")
		if !ok {
			continue
		}
		for _, name := range metricRef.FindAllString(expr, -1) {
			if !known(name) {
				t.Errorf("an alert uses %s, which Tenure does not expose", name)
			}
		}
	}
	doc, err := os.ReadFile("../../docs/monitoring.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range Names() {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/monitoring.md does not document %s", name)
		}
	}
}
