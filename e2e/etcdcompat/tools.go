//go:build tools

// The acceptance tests build etcdctl from this module's pinned version.
package etcdcompat

import _ "go.etcd.io/etcd/etcdctl/v3"
