package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// testDSN returns a DSN for the PostgreSQL server named by TENURE_PG_DSN
// (default DefaultDSN) whose connections use a fresh schema, dropped when
// the test ends. An unreachable server fails the test.
func testDSN(t *testing.T) string {
	t.Helper()
	base := os.Getenv("TENURE_PG_DSN")
	if base == "" {
		base = DefaultDSN
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("PostgreSQL is unreachable at TENURE_PG_DSN (default %s): %v\n"+
			"Start one with .ci/run's PostgreSQL setup (`bash .ci/run` installs and starts it on 127.0.0.1:5432 "+
			"with trust authentication for loopback), or set TENURE_PG_DSN to a reachable server.", DefaultDSN, err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	schema := "example_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		admin.Close(ctx)
	})
	if u, err := url.Parse(base); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return strings.TrimSpace(base) + " search_path=" + schema // keyword/value form
}
