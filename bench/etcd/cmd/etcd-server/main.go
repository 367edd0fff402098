// Command etcd-server is a thin wrapper around the upstream etcd server entry
// point. It accepts the normal etcd flags and exists only so the benchmark
// harness can build an etcd binary of a pinned version from the Go module
// proxy, without the main Tenure module depending on etcd.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
