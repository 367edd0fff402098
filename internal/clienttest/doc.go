// Package clienttest tests the Go client (module
// github.com/tenure-io/tenure/client) against in-process servers. The
// client's own module holds only tests that need no server, so that its
// module graph names none of the server's dependencies; the tests that
// start a server live here, in the server's module.
package clienttest
