//go:build tools

// Package tools pins the etcd server that deploy/compose runs (the real
// server, not the embedded one the tests use). A separate module keeps the
// product's go.mod lean: `CGO_ENABLED=0 go build -o ../../../bin/etcd go.etcd.io/etcd/server/v3`.
package tools

import _ "go.etcd.io/etcd/server/v3"
