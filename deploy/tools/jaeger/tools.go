//go:build tools

// Package tools pins the Jaeger all-in-one (v2, collector-based) binary that
// deploy/compose runs. It is a separate module so the product's go.mod stays
// lean: `CGO_ENABLED=0 go build -o ../../../bin/jaeger github.com/jaegertracing/jaeger/cmd/jaeger`.
package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
