// Package etcdcompat runs real, unmodified etcd clients (etcdctl, clientv3
// and its concurrency package, Node's etcd3) against Tenure's etcd API.
// It is a module of its own, pinned to etcd v3.7.3, so that Tenure's main
// module never depends on etcd's client.
package etcdcompat
